"""Reliability: a killed run resumes to the same loss, SIGTERM/SIGINT in every phase (training,
the evaluation after it, eval.py, a sweep) save what finished and say what to run next, a diverged
run stops at once, and every bad input is one line with exit code 2 before any work.

The tests that kill and resume processes are `slow` (minutes); `.ci/run` runs them after the
fast suite."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, TINY, contract_problems, make_corpus

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# a run long enough to be stopped part-way: 60 steps, a checkpoint every 5; one precision
# whatever the machine (precision=auto is tested on its own: tests/test_precision.py)
RESUMABLE = [
    *[o for o in TINY if not o.startswith(("trainer.max_steps", "logger="))],
    "trainer.max_steps=60",
    "checkpoint.every_n_steps=5",
    "eval.after_train=false",
    "trainer.precision=32-true",
]


def train_cmd(corpus: Path, folder: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), f"data.path={corpus}", *RESUMABLE, *extra,
            f"hydra.run.dir={folder}"]  # fmt: skip


def wandb_env(home: Path) -> dict[str, str]:
    """W&B offline (no credentials), its files under the run folder."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return {**env, "HOME": str(home), "NETRC": str(home / "none"), "WANDB_MODE": "offline"}


def final_val_loss(folder: Path) -> float:
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "completed", status
    return status["val_loss"]


def wandb_run_ids(folder: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*"))


def start_and_wait_for_checkpoint(
    cmd: list[str], folder: Path, env: dict | None = None, until: Any = None,
    cwd: Path | None = None,
) -> subprocess.Popen:  # fmt: skip
    """Start a training run and return once its first periodic checkpoint is on disk (or once
    `until()` is true)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd or folder.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    ckpt = folder / "checkpoints" / "last.ckpt"
    until = until or ckpt.exists
    deadline = time.time() + 240
    while not until():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the run did not get there"
        time.sleep(0.01)
    return proc


def stop_with(proc: subprocess.Popen, *signums: int) -> list[str]:
    """Send the signals (a second one soon after the first), wait for the process: it exits
    with 128 + the last signal and no traceback. Returns its stderr lines."""
    for i, signum in enumerate(signums):
        if i:
            time.sleep(0.05)
        proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signums[-1], stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()


def status_of(folder: Path) -> dict:
    try:
        return json.loads((folder / "status.json").read_text())
    except (OSError, ValueError):  # not there yet, or being replaced
        return {}


@pytest.fixture(scope="module")
def uninterrupted(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """The final validation loss of the run the interrupted ones must reproduce."""
    folder = tmp_path_factory.mktemp("full") / "run"
    env = wandb_env(folder.parent)
    result = subprocess.run(train_cmd(corpus, folder, "logger=wandb"), cwd=folder.parent,
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
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

    resumed = subprocess.run([*cmd, "resume=auto"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
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
    resumed = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={folder}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_val_loss(folder) == pytest.approx(uninterrupted, rel=1e-4)


@pytest.mark.slow
def test_sigterm_in_the_evaluation_after_training_resumes_the_evaluation(corpus, tmp_path):
    """Training finished, its evaluation is stopped: status `interrupted` in phase
    `evaluation`; the printed command runs the evaluation alone and keeps the run's metrics."""
    folder = tmp_path / "run"
    # a slow evaluation (a window per token), so the signal lands inside it
    cmd = train_cmd(corpus, folder, "logger=csv", "trainer.max_steps=20", "eval.after_train=true",
                    "eval.modes=[sliding]", "eval.stride=1")  # fmt: skip
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

    resumed = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={folder}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    status = status_of(folder)
    assert status["status"] == "completed" and status["step"] == 20
    assert status["val_loss"] == val_loss and status["best_val_loss"] <= val_loss
    assert (folder / "extrapolation" / "extrapolation.json").is_file()


@pytest.mark.slow
def test_sigterm_to_a_sweep_names_the_jobs_that_did_not_run_and_resumes_them(corpus, tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(REPO / "train.py"), "-m", "pos=rope,alibi,nope",
           f"data.path={corpus}", *RESUMABLE, "logger=csv", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    first = sweep / "0_rope-tiny-L16"
    proc = start_and_wait_for_checkpoint(cmd, first, cwd=tmp_path)
    lines = stop_with(proc, signal.SIGTERM)
    assert lines[-2].startswith("stopped by SIGTERM at step ")
    assert "jobs 1–2 of 0–2 did not run" in lines[-1], lines[-1]
    command = lines[-1].split("resume it with: ", 1)[1]
    assert status_of(sweep)["jobs_not_run"] == [1, 2]
    assert not (sweep / "1_alibi-tiny-L16").exists()

    args = shlex.split(command)
    assert args[0] == "python"
    resumed = subprocess.run([sys.executable, *args[1:]], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in ("0_rope-tiny-L16", "1_alibi-tiny-L16", "2_nope-tiny-L16"):
        assert status_of(sweep / job)["status"] == "completed", job
        assert status_of(sweep / job)["step"] == 60


@pytest.mark.slow
def test_sigterm_to_eval_py_writes_no_results_and_says_what_to_run(trained_runs, tmp_path):
    out = tmp_path / "eval"
    cmd = [sys.executable, str(REPO / "eval.py"), f"run={trained_runs['rope'][0]}",
           f"out_dir={out}", "eval.modes=[sliding]", "eval.stride=1", "eval.factors=[1,2,4,8]",
           "eval.max_tokens=null"]  # fmt: skip
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


def test_divergence_stops_at_once_and_marks_the_run_failed(corpus, tmp_path):
    folder = tmp_path / "run"
    result = subprocess.run(
        train_cmd(corpus, folder, "logger=csv", "optim.lr=1e6", "optim.warmup_steps=1"),
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
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


def test_fresh_run_refuses_a_folder_with_checkpoints(corpus, tmp_path):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"not touched")
    result = subprocess.run(train_cmd(corpus, folder, "logger=csv"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2
    assert "pass resume=auto to continue it" in result.stderr.strip().splitlines()[-1]
    assert (folder / "checkpoints" / "last.ckpt").read_bytes() == b"not touched"


def test_two_runs_started_together_get_their_own_folders(corpus, tmp_path):
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        f"data.path={corpus}",
        *TINY,
        "logger=none",
        "trainer.max_steps=2",
        "eval.after_train=false",
        "train.validate_before_fit=false",
    ]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    runs = sorted((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(runs) == 2, runs
    for run in runs:
        assert json.loads((run / "status.json").read_text())["status"] == "completed"
        assert (run / "checkpoints" / "last.ckpt").is_file()


def test_wandb_that_cannot_reach_its_server_falls_back_to_offline(corpus, tmp_path):
    """Credentials but no server: the run waits logger.init_timeout seconds, not forever, then
    logs offline and finishes."""
    env = {
        **wandb_env(tmp_path),
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": "http://127.0.0.1:9",
    }  # a port where nothing listens
    folder = tmp_path / "run"
    result = subprocess.run(
        train_cmd(corpus, folder, "logger=wandb", "logger.init_timeout=5", "trainer.max_steps=3"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "W&B could not start online" in result.stdout + result.stderr
    assert list((folder / "wandb").glob("offline-run-*"))
    assert json.loads((folder / "status.json").read_text())["status"] == "completed"


# ---------------------------------------------------------------------------------------------
# bad input: one line on stderr naming the key or file, exit code 2, nothing left behind


@pytest.fixture(scope="module")
def bad_corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad_corpora")
    binary = make_corpus(root / "binary", n_train=50, n_valid=10)
    (binary / "train.txt").write_bytes(bytes(range(256)) * 40)
    latin1 = make_corpus(root / "latin1", n_train=50, n_valid=10)
    (latin1 / "valid.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    blank = make_corpus(root / "blank", n_train=50, n_valid=10)
    (blank / "valid.txt").write_text("\n \n\t\n")
    return {"binary": binary, "latin1": latin1, "blank": blank}


def train_case(*overrides: str) -> tuple[str, list[str]]:
    return "train", list(overrides)


def eval_case(*overrides: str) -> tuple[str, list[str]]:
    return "eval", list(overrides)


# (case, expected text in the one error line); {corpus}, {binary}, {latin1}, {blank},
# {learned}, {rope} and {file} are filled in per run
BAD_INPUTS = [
    (train_case("seed=abc"), "seed=abc must be an integer"),
    (train_case("seed=1.5"), "seed=1.5"),
    (train_case("optim.lr=nan"), "optim.lr=nan must be a finite number > 0"),
    (train_case("optim.lr=-1"), "optim.lr=-1"),
    (train_case("optim.warmup_steps=-1"), "optim.warmup_steps=-1"),
    (train_case("optim.betas=[0.9]"), "optim.betas=[0.9]"),
    (train_case("pos.base=-1"), "pos.base=-1"),
    (train_case("pos.base=0"), "pos.base=0"),
    (train_case("pos.bsae=500"), "pos.bsae: there is no such key"),
    (train_case("pos=foo"), "pos=foo is not an option; choose one of: alibi"),
    (train_case("pos=learned", "eval.unsupported=error"), "pos.max_positions"),
    (train_case("pos=t5", "pos.num_buckets=0"), "pos.num_buckets=0"),
    (train_case("eval.stride=-4"), "eval.stride=-4"),
    (train_case("eval.stride=0"), "eval.stride=0"),
    (train_case("eval.bucket_size=-1"), "eval.bucket_size=-1"),
    (train_case("eval.position_offset=-20"), "eval.position_offset=-20"),
    (train_case("eval.max_tokens=-5"), "eval.max_tokens=-5"),
    (train_case("eval.lengths=[0]"), "eval.lengths=[0]"),
    (train_case("eval.factors=[0.001]"), "eval.factors=[0.001]"),
    (train_case("eval.modes=[foo]"), "eval.modes=[foo]"),
    (train_case("+eval.pos_overrides.max_positions=8"), "eval.pos_overrides.max_positions"),
    (train_case("pos=learned", "+eval.pos_overrides.max_positions=8"), "eval.pos_overrides"),
    (train_case("trainer.max_steps=0"), "trainer.max_steps=0"),
    (train_case("trainer.precision=bf17"), "trainer.precision=bf17"),
    (train_case("data.seq_len=0"), "data.seq_len=0"),
    (train_case("data.batch_size=0"), "data.batch_size=0"),
    (train_case("model.d_model=33"), "model.d_model=33 is not divisible by model.n_head"),
    (train_case("model.dropout=1.5"), "model.dropout=1.5"),
    (train_case("resume=/no/such/run"), "resume=/no/such/run does not exist"),
    (train_case("data.path=/no/such/corpus"), "data.path=/no/such/corpus does not exist"),
    (train_case("data.path={binary}"), "train.txt"),
    (train_case("data.path={latin1}"), "valid.txt"),
    (train_case("data.path={blank}"), "valid.txt"),
    (eval_case(), "pass exactly one of ckpt=PATH"),
    (eval_case("ckpt=/no/such.ckpt"), "/no/such.ckpt does not exist"),
    (eval_case("ckpt={file}"), "train.txt as a checkpoint"),
    (eval_case("run={learned}", "eval.lengths=[32,64]"), "pos.max_positions"),
    (eval_case("run={learned}", "eval.position_offset=-20"), "eval.position_offset=-20"),
    (eval_case("run={learned}", "+eval.pos_overrides.max_positions=8"), "eval.pos_overrides"),
    (eval_case("run={rope}", "data_path={binary}"), "train.txt"),
    (eval_case("run={rope}", "eval.modes=[foo]"), "eval.modes=[foo]"),
    (eval_case("run={rope}", "eval.rope_scaling.kind=foo"), "eval.rope_scaling.kind='foo'"),
    (
        eval_case("run={rope}", "eval.rope_scaling.kind=pi", "eval.rope_scaling.factor=0.5"),
        "eval.rope_scaling.factor=0.5",
    ),
    (eval_case("run={rope}", "eval.rope_scaling.beta_fast=-1"), "eval.rope_scaling.beta_fast=-1"),
    (eval_case("run={learned}", "eval.logn_scaling=true"), "act on rotary schemes"),
    (train_case("pos=alibi", "eval.rope_scaling.kind=pi"), "act on rotary schemes"),
    (train_case("pos=rope", "pos.theta_param=exp"), "pos.theta_param='exp'"),
    (train_case("pos=alibi", "pos.position_dtype=fp16"), "pos.position_dtype='fp16'"),
    # found by the second reliability pass: each was a traceback, or failed after training
    (train_case("seed=-1"), "seed=-1 must be an integer ≥ 0"),
    (train_case("logger=wandb", "logger.init_timeout=abc"), "logger.init_timeout=abc"),
    (train_case("+logger.flush_logs_every_n_steps=abc"), "logger.flush_logs_every_n_steps=abc"),
    (train_case("logger=wandb", "+logger.bogus=1"), "logger.bogus: WandbLogger has no such"),
    (train_case("+trainer.bogus=1"), "trainer.bogus: lightning.Trainer has no such option"),
    (train_case("eval.precision=64-true"), "eval.precision=64-true is not one of"),
    (train_case("eval.precision=bf16-true"), "eval.precision=bf16-true is not one of"),
    (train_case("eval.precision=32"), "eval.precision=32 is not one of"),
    (train_case("trainer.precision=64-true"), "trainer.precision=64-true is not one of"),
    *(
        [(train_case("eval.device=cuda"), "eval.device=cuda but no CUDA device is visible")]
        if not torch.cuda.is_available()
        else []
    ),  # fmt: skip
]


def run_case(kind: str, overrides: list[str], values: dict[str, str], out: Path) -> tuple:
    args = [o.format(**values) for o in overrides]
    if kind == "train":
        cmd = [str(REPO / "train.py"), f"data.path={values['corpus']}", *TINY, "logger=csv",
               *args, f"hydra.run.dir={out}"]  # fmt: skip
    else:
        cmd = [str(REPO / "eval.py"), *args, f"out_dir={out}"]
    result = subprocess.run([sys.executable, *cmd], cwd=out.parent, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    return result, out


def test_every_bad_input_is_one_line_and_exit_code_2(corpus, trained_runs, bad_corpora, tmp_path):
    assert len(BAD_INPUTS) >= 25
    values = {
        "corpus": str(corpus), "learned": str(trained_runs["learned"][0]),
        "rope": str(trained_runs["rope"][0]), "file": str(corpus / "train.txt"),
        **{k: str(v) for k, v in bad_corpora.items()},
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=3) as pool:  # the processes wait on imports mostly
        futures = [
            pool.submit(run_case, kind, overrides, values, tmp_path / f"case{i}")
            for i, ((kind, overrides), _) in enumerate(BAD_INPUTS)
        ]
        results = [f.result() for f in futures]
    failures = []
    for ((kind, overrides), expected), (result, out) in zip(BAD_INPUTS, results, strict=True):
        problems = contract_problems(result, expected.format(**values), out)
        if problems:
            failures.append(f"{kind} {overrides}: {', '.join(problems)}\n{result.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_hydra_flags_that_exclude_each_other_are_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "-m", "--cfg", "job"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: Only one of --run, --multirun, --cfg")
