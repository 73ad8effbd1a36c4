"""A killed run resumes to the same loss; SIGTERM/SIGINT in every phase (training, the evaluation
after it, eval.py, a sweep) save what finished and say what to run next. Real processes:
`slow` (minutes); `.ci/run` runs them after the fast suite."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO
from processes import (
    RESUMABLE,
    final_val_loss,
    start_and_wait_for_checkpoint,
    status_of,
    stop_with,
    train_cmd,
    wandb_env,
    wandb_run_ids,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def uninterrupted(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """The final validation loss of the run the interrupted ones must reproduce."""
    folder = tmp_path_factory.mktemp("full") / "run"
    env = wandb_env(folder.parent)
    result = subprocess.run(
        train_cmd(corpus, folder, "logger=wandb"),
        cwd=folder.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return final_val_loss(folder)


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_loss(corpus, tmp_path, uninterrupted):
    """SIGKILL mid-way (no chance to clean up), then resume=auto in the same folder: the same
    final validation loss as the uninterrupted run, and the same W&B run continues."""
    folder = tmp_path / "run"
    env = wandb_env(tmp_path)
    cmd = train_cmd(corpus, folder, "logger=wandb")
    proc = start_and_wait_for_checkpoint(cmd, folder, env)
    proc.kill()
    proc.wait()
    step = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < step < 60  # it really stopped part-way
    assert json.loads((folder / "status.json").read_text())["status"] == "running"

    resumed = subprocess.run(
        [*cmd, "resume=auto"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_val_loss(folder) == pytest.approx(uninterrupted, rel=1e-4)
    ids = wandb_run_ids(folder)
    assert len(ids) == 2 and ids[0] == ids[1], ids  # one W&B run, continued


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_says_how_to_resume(corpus, tmp_path, uninterrupted):
    folder = tmp_path / "run"
    env = wandb_env(tmp_path)
    proc = start_and_wait_for_checkpoint(train_cmd(corpus, folder, "logger=csv"), folder, env)
    lines = stop_with(proc, signal.SIGTERM)
    last_line = lines[-1]
    assert last_line.startswith("stopped by SIGTERM at step ")
    assert last_line.endswith(f"resume with: python train.py resume={folder}")
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "interrupted" and 0 < status["step"] < 60
    assert (folder / "train.log").read_text().strip().splitlines()[-1] == last_line

    # the printed command, as a user would paste it: the run's own overrides come from its folder
    resumed = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={folder}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_val_loss(folder) == pytest.approx(uninterrupted, rel=1e-4)


@pytest.mark.slow
def test_sigint_twice_stops_at_once_and_still_says_how_to_resume(corpus, tmp_path, uninterrupted):
    folder = tmp_path / "run"
    proc = start_and_wait_for_checkpoint(train_cmd(corpus, folder, "logger=csv"), folder)
    # impatient: the second one does not wait for the step
    lines = stop_with(proc, signal.SIGINT, signal.SIGINT)
    last_line = lines[-1]
    assert last_line.startswith("stopped by SIGINT at step ")
    assert last_line.endswith(f"resume with: python train.py resume={folder}")
    assert status_of(folder)["status"] == "interrupted"
    resumed = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={folder}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_val_loss(folder) == pytest.approx(uninterrupted, rel=1e-4)


@pytest.mark.slow
def test_ctrl_c_held_down_until_the_run_exits_still_ends_in_one_stop_line(corpus, tmp_path):
    """SIGINT every few milliseconds from the first one until the process is gone: whichever
    phase each lands in (the step, the save, Lightning's teardown, the report, the exit), the
    run stops with 130, the training's stop line and no traceback. (A signal after the report
    once met Python's own handler again: a KeyboardInterrupt at exit, killed by SIGINT.)"""
    folder = tmp_path / "run"
    proc = start_and_wait_for_checkpoint(train_cmd(corpus, folder, "logger=csv"), folder)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.005)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("stopped by SIGINT at step "), stderr[-3000:]
    assert status_of(folder)["status"] == "interrupted"


@pytest.mark.slow
def test_sigterm_in_the_evaluation_after_training_resumes_the_evaluation(corpus, tmp_path):
    """Training finished, its evaluation is stopped: status `interrupted` in phase
    `evaluation`; the printed command runs the evaluation alone and keeps the run's metrics."""
    folder = tmp_path / "run"
    # a slow evaluation (a window per token), so the signal lands inside it
    cmd = train_cmd(
        corpus,
        folder,
        "logger=csv",
        "trainer.max_steps=20",
        "eval.after_train=true",
        "eval.modes=[sliding]",
        "eval.stride=1",
    )
    proc = start_and_wait_for_checkpoint(
        cmd, folder, until=lambda: status_of(folder).get("phase") == "evaluation"
    )
    lines = stop_with(proc, signal.SIGTERM)
    last_line = lines[-1]
    assert last_line.startswith("stopped by SIGTERM in the evaluation after training")
    assert last_line.endswith(f"resume with: python train.py resume={folder}")
    status = status_of(folder)
    assert status["status"] == "interrupted" and status["phase"] == "evaluation", status
    assert not (folder / "extrapolation" / "extrapolation.json").exists()
    val_loss = status["val_loss"]  # recorded when training finished

    resumed = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={folder}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    status = status_of(folder)
    assert status["status"] == "completed" and status["step"] == 20
    assert status["val_loss"] == val_loss and status["best_val_loss"] <= val_loss
    assert (folder / "extrapolation" / "extrapolation.json").is_file()


@pytest.mark.slow
def test_sigterm_to_a_sweep_names_the_jobs_that_did_not_run_and_resumes_them(corpus, tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        "pos=rope,alibi,nope",
        f"data.path={corpus}",
        *RESUMABLE,
        "logger=csv",
        f"hydra.sweep.dir={sweep}",
    ]
    job = "{}_wikitext2-{}-tiny-L16-60steps-s1234".format  # the job folders' names
    first = sweep / job(0, "rope")
    proc = start_and_wait_for_checkpoint(cmd, first, cwd=tmp_path)
    lines = stop_with(proc, signal.SIGTERM)
    assert lines[-2].startswith("stopped by SIGTERM at step ")
    assert "jobs 1–2 of 0–2 did not run" in lines[-1], lines[-1]
    command = lines[-1].split("resume it with: ", 1)[1]
    assert status_of(sweep)["jobs_not_run"] == [1, 2]
    assert not (sweep / job(1, "alibi")).exists()

    args = shlex.split(command)
    assert args[0] == "python"
    resumed = subprocess.run(
        [sys.executable, *args[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for folder in (job(0, "rope"), job(1, "alibi"), job(2, "nope")):
        assert status_of(sweep / folder)["status"] == "completed", folder
        assert status_of(sweep / folder)["step"] == 60


@pytest.mark.slow
def test_sigterm_to_eval_py_writes_no_results_and_says_what_to_run(trained_runs, tmp_path):
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        str(REPO / "eval.py"),
        f"run={trained_runs['rope'][0]}",
        f"out_dir={out}",
        "eval.modes=[sliding]",
        "eval.stride=1",
        "eval.factors=[1,2,4,8]",
        "eval.max_tokens=null",
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    log = out / "eval.log"
    deadline = time.time() + 120
    while not (log.exists() and "evaluating on" in log.read_text()):  # the scoring has begun
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.01)
    lines = stop_with(proc, signal.SIGTERM)
    line = lines[-1]
    assert line.startswith("stopped by SIGTERM during the evaluation; no results were written")
    assert json.loads((out / "eval_status.json").read_text())["status"] == "interrupted"
    assert not list(out.glob("**/extrapolation.json"))
    # an evaluation that then runs to its end there says so (it stayed "interrupted": #43)
    again = [*cmd[:4], "eval.factors=[1]", "eval.max_tokens=800"]
    done = subprocess.run(again, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "eval_status.json").read_text())["status"] == "completed"
