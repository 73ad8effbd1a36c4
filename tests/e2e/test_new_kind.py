"""A new eval-time RoPE extension kind is one module of positions/extensions/ and one file of
conf/extension/: added to a copy of the repository, `eval.rope_scaling.kind=NAME` picks it, with
its options' defaults from its file, for poslab checkpoints, without a line elsewhere changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, make_corpus
from processes import copy_of_the_repository, run

pytestmark = pytest.mark.slow

NAME = "shrink"

# θ_i / s^power: power 1 turns every angle as PI does (m/s · θ = m · θ/s)
MODULE = '''"""`shrink`: every frequency divided by s^power (power 1: the angles of PI)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from poslab.checks import number, require
from poslab.positions.extensions.base import Extension


@dataclass(frozen=True)
class Shrink(Extension):
    power: float = 0.5

    def check(self) -> None:
        require("eval.rope_scaling.power", self.power, number(gt=0))

    @property
    def rescales_theta(self) -> bool:
        return self.factor != 1

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        return theta / self.factor**self.power
'''

CONFIG = """# eval.rope_scaling.kind=shrink: frequencies divided by s^power (test_new_kind.py)
_target_: poslab.positions.extensions.shrink.Shrink
power: 0.5
"""


@pytest.fixture(scope="module")
def repo_with_kind(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_of_the_repository(tmp_path_factory.mktemp("repo"))
    (root / "src" / "poslab" / "positions" / "extensions" / f"{NAME}.py").write_text(MODULE)
    (root / "src" / "poslab" / "conf" / "extension" / f"{NAME}.yaml").write_text(CONFIG)
    return root


def test_the_new_kind_is_listed_and_takes_its_files_defaults(repo_with_kind):
    script = (
        "import torch\n"
        "from poslab.positions.rope_scaling import KINDS, RopeScaling\n"
        f"assert {NAME!r} in KINDS, KINDS\n"
        f"scaling = RopeScaling({NAME!r}, 4.0, 64)\n"
        "assert scaling.power == 0.5 and scaling.label() == 'shrink s=4', scaling.label()\n"
        "theta = torch.tensor([1.0, 0.1])\n"
        "assert torch.equal(scaling.theta(theta, 4, 64), theta / 2)\n"
        f"assert RopeScaling({NAME!r}, 1.0, 64).is_identity()\n"
    )
    result = run(["-c", script], repo_with_kind, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_eval_py_scores_with_it(repo_with_kind, tmp_path):
    """power=1 gives PI's angles: the same perplexities as kind=pi, at every length."""
    corpus = make_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    overrides = ["pos=rope", f"data.path={corpus}", *TINY, "eval.after_train=false"]
    result = run(["train.py", *overrides, f"hydra.run.dir={out}"], repo_with_kind, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = {}
    for kind, extra in (("pi", []), (NAME, ["+eval.rope_scaling.power=1"])):
        args = [
            "eval.py",
            f"run={out}",
            f"out_dir={tmp_path / kind}",
            "wandb=false",
            "eval.precision=32-true",
            "eval.factors=[1,2,4]",
            f"eval.rope_scaling.kind={kind}",
            *extra,
        ]
        result = run(args, repo_with_kind, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        path = tmp_path / kind / "extrapolation" / "extrapolation.json"
        tables[kind] = json.loads(path.read_text())
    assert [r["scheme"] for r in tables[NAME]][-1] == "rope + shrink s=auto"
    ppl = {kind: [r["ppl"] for r in rows] for kind, rows in tables.items()}
    assert ppl[NAME] == pytest.approx(ppl["pi"], rel=1e-5)
    assert ppl[NAME][0] != ppl[NAME][-1]
