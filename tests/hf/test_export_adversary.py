"""scripts/export_hf.py against bad input, fourth pass (#60): paths that do not exist, runs
without a checkpoint, folders of another kind (a study, a sweep: one line naming a run; a folder
inside a run or an eval.py out_dir: the run's checkpoint, exported as it is), empty paths. Each
bad input is one `error:` line, exit code 2, nothing at --out; real folders and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_corpus, train_in_process

from poslab.hf.export import main


def refused(argv: list[str], out: Path, capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()
    return err[0]


def fake_run(folder: Path, checkpoint: str | None = "best.ckpt") -> Path:
    """A run folder as train.py leaves it (its config; a checkpoint file where named: only its
    path is read by the tests that use this)."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    if checkpoint is not None:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / checkpoint).write_bytes(b"not read here")
    return folder


def test_a_path_that_does_not_exist_is_said_so(tmp_path, capsys):
    out = tmp_path / "hf"
    line = refused([str(tmp_path / "no-run"), "--out", str(out)], out, capsys)
    assert f"{tmp_path / 'no-run'} does not exist; pass a run folder" in line  # "not a run folder"
    line = refused([str(tmp_path / "no.ckpt"), "--out", str(out)], out, capsys)
    assert f"{tmp_path / 'no.ckpt'} does not exist" in line and "ckpt=PATH" not in line


@pytest.mark.parametrize("checkpoints", [True, False], ids=["empty-checkpoints", "none"])
def test_a_run_without_a_checkpoint_is_told_to_train_on(checkpoints, tmp_path, capsys):
    """A run stopped before its first checkpoint: it was eval.py's advice (pass ckpt=PATH), or
    "not a run folder" where it had no checkpoints/ yet."""
    run = fake_run(tmp_path / "run", checkpoint=None)
    if checkpoints:
        (run / "checkpoints").mkdir()
    out = tmp_path / "hf"
    line = refused([str(run), "--out", str(out)], out, capsys)
    assert f"{run} has no checkpoint yet" in line and f"python train.py resume={run}" in line
    assert "ckpt=PATH" not in line


def test_a_study_or_sweep_folder_names_a_run_to_export(tmp_path, capsys):
    out = tmp_path / "hf"
    study = tmp_path / "study"
    fake_run(study / "runs" / "rope-s1")
    (study / "study.json").write_text("{}")
    line = refused([str(study), "--out", str(out)], out, capsys)
    assert f"{study} holds 1 run(s), e.g. {study}/runs/rope-s1; export one of them" in line
    sweep = tmp_path / "sweep"
    fake_run(sweep / "0"), fake_run(sweep / "1")
    line = refused([str(sweep), "--out", str(out)], out, capsys)
    assert f"{sweep} holds 2 run(s), e.g. {sweep}/0; export one of them" in line


@pytest.mark.parametrize("option", ["--out", "run", "--data-path"])
def test_an_empty_path_is_one_line(option, tmp_path, capsys):
    """`""` (an unset shell variable) was the current folder (--out, run), or ignored
    (--data-path)."""
    run, out = str(fake_run(tmp_path / "run")), str(tmp_path / "hf")
    argv = {
        "run": ["", "--out", out],
        "--out": [run, "--out", ""],
        "--data-path": [run, "--out", out, "--data-path", ""],
    }[option]
    line = refused(argv, tmp_path / "hf", capsys)
    assert f"argument {option}: the path is empty" in line


def test_a_data_path_that_is_a_file_is_said_so(tmp_path, capsys):
    run, text = fake_run(tmp_path / "run"), tmp_path / "train.txt"
    text.write_text("a corpus file, not its folder\n")
    out = tmp_path / "hf"
    line = refused([str(run), "--out", str(out), "--data-path", str(text)], out, capsys)
    assert f"--data-path {text}: is a file; pass the corpus folder" in line  # "no such folder"


# folders of another kind that name a run: its checkpoint


def test_a_folder_inside_a_run_or_an_eval_out_dir_names_the_runs_checkpoint(tmp_path):
    from poslab.hf.export import checkpoint_to_export

    run = fake_run(tmp_path / "run")
    best = run / "checkpoints" / "best.ckpt"
    assert checkpoint_to_export(run / "checkpoints") == best  # (end to end: the slow test below)
    (run / "extrapolation-2026-01-01_00-00-00").mkdir()
    assert checkpoint_to_export(run / "extrapolation-2026-01-01_00-00-00") == best
    out_dir = tmp_path / "scored"  # eval.py run=RUN out_dir=scored
    (out_dir / "extrapolation").mkdir(parents=True)
    (out_dir / "evaluated_run.json").write_text(json.dumps({"run": str(run)}))
    assert checkpoint_to_export(out_dir) == best


@pytest.mark.slow  # trains a run (2 steps)
def test_a_runs_checkpoints_folder_exports_that_run(tmp_path, monkeypatch, capsys):
    """RUN/checkpoints was "not a run folder (no checkpoints/)"; now the run's model, checked
    against poslab's logits as every export is."""
    corpus = make_corpus(tmp_path / "corpus", n_train=200, n_valid=40)
    run = tmp_path / "run"
    train_in_process(
        "rope", corpus, run, ["trainer.max_steps=2", "eval.after_train=false", "logger=none"]
    )
    monkeypatch.chdir(tmp_path)
    main([str(run / "checkpoints"), "--out", "hf"])
    assert "wrote hf (GPTNeoXForCausalLM" in capsys.readouterr().out
    assert (tmp_path / "hf" / "config.json").is_file()
