"""The study driver (scripts/study.py) against bad input, fourth pass (#60): recipe files that
are no text or repeat a key, `evals:` that would fail only after training, options given twice,
and a study folder whose files were cut off or hand-edited. Each is one `error:` line with exit
code 2 before any work (`--dry-run`: a regression must not start a study), or, for a job's
unreadable status, the plan as for a job that wrote none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poslab.study.driver import main

TINY = ["model=tiny", "data.seq_len=16", "data.batch_size=16", "trainer.precision=32-true"]
ONE_JOB = "experiment: quickstart\njobs:\n  rope: [pos=rope]\n"


def dry_run(recipe: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [str(recipe), f"data.path={corpus}", *TINY, "--out", str(out), "--device", "cpu",
            "--dry-run", *extra]  # fmt: skip


def refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


RECIPES = [
    (b"\xff\xfe\x00experiment", "is not a text file (not UTF-8)"),
    (
        b"experiment: quickstart\ngrid: {pos: [rope]}\ngrid: {pos: [alibi]}\n",
        "'grid' is given twice in one mapping",
    ),
    (b"experiment: quickstart\njobs:\n  a: [pos=rope]\n  a: [pos=alibi]\n", "'a' is given twice"),
    (ONE_JOB.encode() + b"evals: {test: [eval.splt=test]}\n", "evals.test: eval.splt: there is no"),
    (ONE_JOB.encode() + b"evals: {test: [eval.split=tset]}\n", "eval.split=tset is not one of"),
    (ONE_JOB.encode() + b"evals: {test: [wandb=maybe]}\n", "wandb=maybe must be true or false"),
    (
        ONE_JOB.encode() + b"evals: {test: [eval.split=test], again: [eval.split=test]}\n",
        "evals.again is evals.test again",
    ),
    (b"experiment: quickstart\njobs: {a: [pos=rope, pos=alibi]}\n", "job a set pos twice"),
]


@pytest.mark.parametrize(("text", "expected"), RECIPES, ids=[e for _, e in RECIPES])
def test_a_bad_recipe_is_one_line_before_any_work(text, expected, corpus, tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes(text)
    line = refused(dry_run(recipe, corpus, tmp_path / "s"), capsys)
    assert expected in line, line
    assert not (tmp_path / "s").exists()


OPTIONS = [
    (["--gpus", "0,0"], "--gpus 0,0: name each GPU once"),
    (["--gpus", "-1"], "--gpus -1: name each GPU once"),
    (["--out", ""], "argument --out: the path is empty"),  # it was outputs/studies/<recipe>
]


@pytest.mark.parametrize(("extra", "expected"), OPTIONS, ids=[" ".join(a) for a, _ in OPTIONS])
def test_a_gpu_named_twice_or_an_empty_out_is_one_line(extra, expected, corpus, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(ONE_JOB)
    argv = dry_run(recipe, corpus, tmp_path / "s", *extra)
    if "--gpus" in extra:  # --device cpu would refuse any --gpus
        argv.remove("--device"), argv.remove("cpu")
    line = refused(argv, capsys)
    assert expected in line, line
    assert not (tmp_path / "s").exists()


def study_folder(tmp_path: Path, jobs: object) -> tuple[Path, Path]:
    """A recipe and a study folder it made, whose study.json holds `jobs`."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(ONE_JOB)
    out = tmp_path / "s"
    out.mkdir()
    state = {"recipe": "r", "source": str(recipe), "jobs": jobs}
    (out / "study.json").write_text(json.dumps(state))
    return recipe, out


@pytest.mark.parametrize("jobs", [["rope"], {"rope": "completed"}], ids=["list", "entry-text"])
def test_a_hand_edited_study_json_is_one_line(jobs, corpus, tmp_path, capsys):
    """Its job entries are read when the study resumes: a list, or an entry that is no
    mapping, was an AttributeError there."""
    recipe, out = study_folder(tmp_path, jobs)
    line = refused(dry_run(recipe, corpus, out), capsys)
    assert f"{out}/study.json cannot be read" in line


def test_a_jobs_status_that_is_no_object_is_a_job_without_status(corpus, tmp_path, capsys):
    """runs/<job>/status.json holding a list (a hand edit) was an AttributeError in the plan; a
    cut-off one was already read as no status: now both are."""
    recipe, out = study_folder(tmp_path, {})
    (out / "runs" / "rope").mkdir(parents=True)
    (out / "runs" / "rope" / "status.json").write_text('["completed"]')
    assert main(dry_run(recipe, corpus, out)) == 0
    assert "| rope |" in capsys.readouterr().out


def test_a_jobs_unreadable_config_is_said_as_it_is(corpus, tmp_path, capsys):
    """A job folder whose .hydra/config.yaml is cut off was "ran with data.path=None, the
    study now gives ...": every option read as changed."""
    recipe, out = study_folder(tmp_path, {})
    hydra = out / "runs" / "rope" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text("model:\n  d_model: [64\n")
    line = refused(dry_run(recipe, corpus, out), capsys)
    assert f"job rope: {hydra}/config.yaml cannot be read (cut off or hand-edited)" in line
