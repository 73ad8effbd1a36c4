"""train.py (poslab/apps/train.py): every bad input is one `error: ...` line with exit code 2
before any work, leaving no run folder; run in-process through the `entry()` the command calls
(the same table as real processes: tests/e2e/test_bad_inputs_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bad_inputs import TRAIN_BAD, case_problems
from conftest import REPO, SCHEMES, TINY, case_values, run_in_process
from processes import train_cmd

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def train_args(corpus: Path, folder: Path, *extra: str) -> list[str]:
    """The arguments of the resumable run of the system tests (processes.train_cmd)."""
    return train_cmd(corpus, folder, *extra)[2:]


def test_the_table_is_not_cut_short():
    assert len(TRAIN_BAD) >= 40


@pytest.mark.parametrize("case", TRAIN_BAD, ids=[c.id for c in TRAIN_BAD])
def test_every_bad_input_is_one_line_and_exit_code_2(case, request, tmp_path, monkeypatch, capfd):
    out = tmp_path / "case"
    app_values = case_values(request, case.args + case.expected)
    result = run_in_process("train", case.argv(app_values, out), tmp_path, monkeypatch, capfd)
    problems = case_problems(case, result, app_values, out)
    assert not problems, f"{', '.join(problems)}\n{result.stderr[-1500:]}"


def test_cli_errors_are_one_clear_line(corpus, tmp_path, monkeypatch, capfd):
    unknown = run_in_process("train", ["pos=nosuchscheme"], tmp_path, monkeypatch, capfd)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        f"error: pos=nosuchscheme is not an option; choose one of: {', '.join(SCHEMES)}"
    ]
    odd = run_in_process(
        "train",
        [f"data.path={corpus}", *TINY, "pos=rope", "pos.fraction=0.03125"],
        tmp_path,
        monkeypatch,
        capfd,
    )
    assert odd.returncode == 2
    assert "Traceback" not in odd.stderr
    assert "error: rope rotates pairs of dims" in odd.stderr


def test_hydra_flags_that_exclude_each_other_are_one_line(tmp_path):
    """The fast suite's real `python train.py` process: the command's wiring (the shim, Hydra's
    argument parsing, the exit code) as a user meets it."""
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "--cfg", "job"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: Only one of --run, --multirun, --cfg")


def test_divergence_stops_at_once_and_marks_the_run_failed(corpus, tmp_path, monkeypatch, capfd):
    folder = tmp_path / "run"
    args = train_args(corpus, folder, "logger=csv", "optim.lr=1e6", "optim.warmup_steps=1")
    result = run_in_process("train", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: train/loss is nan at step ")
    assert "lower optim.lr (now 1e+06)" in error
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "failed" and "diverged" in status["error"]
    assert (folder / "train.log").read_text().strip().splitlines()[-1] == error
    assert not (folder / "extrapolation").exists()
    for ckpt in (folder / "checkpoints").glob("*.ckpt"):  # only finite weights were ever saved
        weights = torch.load(ckpt, weights_only=True)["state_dict"].values()
        assert all(torch.isfinite(w).all() for w in weights)


def test_fresh_run_refuses_a_folder_with_checkpoints(corpus, tmp_path, monkeypatch, capfd):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"not touched")
    args = train_args(corpus, folder, "logger=csv")
    result = run_in_process("train", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 2
    assert "pass resume=auto to continue it" in result.stderr.strip().splitlines()[-1]
    assert (folder / "checkpoints" / "last.ckpt").read_bytes() == b"not touched"
