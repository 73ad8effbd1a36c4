"""A new positional scheme is one module, one YAML file and its row in docs/options.md (which
tests/test_docs.py holds to conf/pos/): added to a copy of the repository, it is picked up by
every scheme-parametrised test of that copy, and it trains with train.py, without a line of any
test changed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY, make_corpus
from processes import copy_of_the_repository, run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAME = "shifted_alibi"

# a relative bias unlike every existing one: ALiBi's penalty, starting `shift` tokens back
MODULE = '''"""ALiBi, its penalty starting `shift` back: -slope_h * max(m - n - shift, 0)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, require
from poslab.positions.alibi import alibi_slopes
from poslab.positions.base import PositionalScheme


class ShiftedALiBi(PositionalScheme):
    needs = "bias"
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, shift: int = 2, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.shift", shift, integer(0))
        self.shift = shift
        slopes = torch.tensor(alibi_slopes(n_head), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        return -self.slopes[head] * (q_position - k_position - self.shift).clamp(min=0)
'''

CONFIG = """# ALiBi whose penalty starts `shift` tokens back (tests/e2e/test_new_scheme.py).
defaults:  # this file's options, then those it shares with other schemes (_shared/)
  - _self_
  - _shared/randomize_max@_here_
  - _shared/position_dtype@_here_

_target_: poslab.positions.shifted_alibi.ShiftedALiBi
shift: 2
"""


@pytest.fixture(scope="module")
def repo_with_scheme(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_of_the_repository(tmp_path_factory.mktemp("repo"))
    positions = root / "src" / "poslab" / "positions"
    (positions / f"{NAME}.py").write_text(MODULE)
    (root / "src" / "poslab" / "conf" / "pos" / f"{NAME}.yaml").write_text(CONFIG)
    add_documentation(root / "docs" / "options.md")
    return root


def add_documentation(options: Path) -> None:
    """The scheme's row in the scheme table, and its name in the `pos` group's list."""
    lines = options.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| `nope` |"):
            lines.insert(
                i + 1, f"| `{NAME}` | ALiBi's penalty starting `shift` back | `shift` (2) |"
            )
            break
    for i, line in enumerate(lines):
        if line.startswith("| `pos` |"):
            lines[i] = line.replace("`nope ", f"`nope {NAME} ", 1)
            break
    options.write_text("\n".join(lines) + "\n")


def test_the_new_scheme_is_listed_and_built(repo_with_scheme):
    script = (
        "from poslab.positions import build_scheme, scheme_class, scheme_configs, scheme_names\n"
        f"assert {NAME!r} in scheme_names(), scheme_names()\n"
        f"config = scheme_configs()[{NAME!r}]\n"
        "assert config['randomize_max'] is None and config['position_dtype'] == 'fp32', config\n"
        f"assert scheme_class({NAME!r}).shift_invariant\n"
        f"assert build_scheme({NAME!r}, 32, 4).shift == 2\n"
    )
    result = run(["-c", script], repo_with_scheme, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_whole_fast_suite_passes_and_covers_it(repo_with_scheme):
    """The README's test command, run in the copy: every test passes with the new scheme in
    conf/pos/, and the scheme-parametrised tests include it."""
    args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not slow", "-n", "auto", "tests"]
    result = run(args, repo_with_scheme, timeout=1500)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # xdist's -v lines read "[gw0] [ 3%] PASSED tests/…::test[…]"
    passed = [
        test
        for line in result.stdout.splitlines()
        if "PASSED" in line
        for test in re.findall(rf"::(\w+)\[[^\]]*{NAME}[^\]]*\]", line)
    ]
    # at least the tests over every scheme of conf/pos/ (causality, per-sequence positions) and
    # the m − n property of the schemes that declare shift_invariant
    assert len(passed) >= 3, result.stdout[-4000:]
    assert any(re.search("relative|shift|invariant|m_minus_n", test) for test in passed), passed


def test_train_py_trains_it(repo_with_scheme, tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    overrides = [f"pos={NAME}", f"data.path={corpus}", *TINY, "eval.after_train=false"]
    result = run(["train.py", *overrides, f"hydra.run.dir={out}"], repo_with_scheme, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "checkpoints" / "best.ckpt").is_file()
    saved = (out / ".hydra" / "config.yaml").read_text()
    assert f"_target_: poslab.positions.{NAME}.ShiftedALiBi" in saved
