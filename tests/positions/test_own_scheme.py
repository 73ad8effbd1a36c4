"""A researcher's own scheme outside the package (POSLAB_USER, docs/own-scheme.md): listed beside
poslab's, composed by Hydra, put through the property checks by poslab-check-scheme, and every
bad input one line. The shipped example (examples/own-scheme/) is the scheme used."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from poslab.apps.check_scheme import main as check_scheme
from poslab.errors import EXIT_BAD_INPUT
from poslab.positions import scheme_class, scheme_names, scheme_yaml, shipped_scheme_names

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-scheme"

# two schemes whose claims are false: the checks must say so
BROKEN = '''
import torch
from poslab.positions import PositionalScheme


class ClaimsRelative(PositionalScheme):
    """Declares shift invariance but penalises a key's absolute position."""
    needs = "bias"
    shift_invariant = True

    def score_bias(self, head, q_position, k_position, layer=0):
        return -0.5 * (head + 1) * torch.log1p(k_position)


class PeeksAhead(PositionalScheme):
    """Adds the next token's embedding to each token's: the future leaks."""
    def embed(self, x, positions):
        return x + torch.roll(x, shifts=-1, dims=1)
'''


@pytest.fixture
def user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The example's folder, copied, as POSLAB_USER."""
    folder = tmp_path / "mine"
    shutil.copytree(EXAMPLE, folder)
    monkeypatch.setenv("POSLAB_USER", str(folder))
    return folder


def one_line_exit(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        check_scheme(argv)
    assert stop.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_the_users_scheme_is_listed_composed_and_built(user):
    assert "logdist" in scheme_names() and "logdist" not in shipped_scheme_names()
    config = scheme_yaml("logdist")
    # poslab's shared options reach the user's file through its defaults list
    assert config["randomize_max"] is None and config["position_dtype"] == "fp32"
    assert scheme_class("logdist").__name__ == "LogDistance"
    with initialize_config_module(version_base="1.3", config_module="poslab.conf"):
        cfg = compose("train", overrides=["pos=logdist", "pos.scale=2"])
    assert cfg.pos._target_ == "myscheme.LogDistance" and cfg.pos.scale == 2


def test_without_the_setting_nothing_changes(monkeypatch):
    monkeypatch.delenv("POSLAB_USER", raising=False)
    assert scheme_names() == shipped_scheme_names()


def test_check_scheme_passes_the_example_on_every_kernel(user, capsys):
    assert check_scheme(["pos=logdist", "pos.scale=0.5"]) == 0
    out = capsys.readouterr().out
    assert "all passed" in out and "FAIL" not in out
    for check in ("causality", "depends on m − n only", "per-sequence positions"):
        assert f"| {check} | sdpa | pass |" in out
    assert "| equals the reference kernel | sdpa | pass |" in out


def test_check_scheme_runs_a_shipped_scheme_too(capsys):
    assert check_scheme(["pos=learned"]) == 0
    assert "| sees an offset |" in capsys.readouterr().out  # absolute: the offset must show


def test_check_scheme_catches_a_false_claim_and_a_leak(user, capsys):
    (user / "broken.py").write_text(BROKEN)
    pos = user / "conf" / "pos"
    (pos / "claims.yaml").write_text("_target_: broken.ClaimsRelative\n")
    (pos / "peeks.yaml").write_text("_target_: broken.PeeksAhead\n")
    assert check_scheme(["pos=claims"]) == 1
    out = capsys.readouterr().out
    assert "| depends on m − n only | sdpa | FAIL: shifting every position" in out
    assert "| causality | sdpa | pass |" in out
    assert check_scheme(["pos=peeks"]) == 1
    out = capsys.readouterr().out
    assert "| causality | sdpa | FAIL: tokens after 0 changed the logits up to 0" in out


def test_every_bad_input_is_one_line(user, capsys, monkeypatch, tmp_path):
    pos = user / "conf" / "pos"
    (pos / "ghost.yaml").write_text("_target_: nosuchmodule.Thing\n")
    assert "does not import (ModuleNotFoundError" in one_line_exit(capsys, ["pos=ghost"])
    (pos / "plain.yaml").write_text("_target_: collections.OrderedDict\n")
    assert "is not a PositionalScheme" in one_line_exit(capsys, ["pos=plain"])
    (pos / "typo.yaml").write_text("_target_: myscheme.LogDistanse\n")
    assert "no class 'LogDistanse' in myscheme" in one_line_exit(capsys, ["pos=typo"])
    assert "pos.scale=-1 must be a finite number > 0" in one_line_exit(
        capsys, ["pos=logdist", "pos.scale=-1"]
    )
    assert "no such scheme" in one_line_exit(capsys, ["pos=logdits"])
    assert "name the scheme: pos=NAME" in one_line_exit(capsys, ["pos.scale=1"])
    for name in ("ghost", "plain", "typo"):
        (pos / f"{name}.yaml").unlink()
    (pos / "rope.yaml").write_text("_target_: myscheme.LogDistance\n")
    assert "shadows poslab's scheme 'rope'" in one_line_exit(capsys, ["pos=logdist"])
    (pos / "rope.yaml").unlink()
    monkeypatch.setenv("POSLAB_USER", str(tmp_path / "nowhere"))
    assert "conf/pos is not a folder" in one_line_exit(capsys, ["pos=rope"])
