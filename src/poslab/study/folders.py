"""A study's folder: <out>/runs/<job>/ is each job's run folder, whose status.json and last
checkpoint say how far the job got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError
from poslab.study.recipe import Study


def run_folder(out: Path, name: str) -> Path:
    return out / "runs" / name


def eval_folder(out: Path, evaluation: str, name: str) -> Path:
    """Where the study's evaluation `evaluation` of job `name` writes (eval.py's out_dir)."""
    return out / "evals" / evaluation / name


def evals_missing(out: Path, study: Study, name: str) -> list[str]:
    """The study's evaluations (recipe `evals:`) that job `name` has no result of yet."""
    return [
        e
        for e in study.evals
        if not (eval_folder(out, e, name) / "extrapolation" / "extrapolation.json").is_file()
    ]


def job_status(out: Path, name: str) -> dict[str, Any]:
    """The job's status.json; {} without one, or for one that is no JSON object (cut off, or
    hand-edited), as for a run that wrote none: its checkpoint says how far it got."""
    try:
        status = json.loads((run_folder(out, name) / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def checkpoint_step(folder: Path) -> int | None:
    """The step of the run's last checkpoint (its pickle only: the tensors stay on disk), or
    None without one. A killed run's status.json still says `running`, with no step."""
    path = folder / "checkpoints" / "last.ckpt"
    if not path.is_file():
        return None
    import torch

    try:
        return int(
            torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"]
        )
    except Exception:  # a checkpoint cut off mid-write: the run starts anew  # noqa: BLE001
        return None


def progress_of(out: Path, study: Study) -> dict[str, float]:
    """Each job's done fraction: 1 for a completed run with every evaluation of the study, 0.95
    for one still without some, its last checkpoint's share of the steps for a cut-off one, 0
    for none."""
    progress = {}
    for job in study.jobs:
        status = job_status(out, job.name)
        if status.get("status") == "completed":
            progress[job.name] = 0.95 if evals_missing(out, study, job.name) else 1.0
        elif step := checkpoint_step(run_folder(out, job.name)):
            progress[job.name] = min(0.99, step / job.config["trainer"]["max_steps"])
    return progress


def check_runs_match(out: Path, study: Study) -> None:
    """A job whose folder holds a run resumes (or is skipped as finished) only if that run has
    the job's settings now: a recipe edited since, other overrides, or a folder copied from
    elsewhere would merge other models into one row, with exit code 0."""
    from poslab.report.compare import ADDED_LATER, run_options

    for job in study.jobs:
        folder = run_folder(out, job.name)
        if not (folder / ".hydra" / "config.yaml").is_file():
            continue  # no run took the folder yet (train.py refuses a checkpoint of another run)
        ran = run_options(folder)
        if ran is None:  # all its options would read as changed, each None
            raise ConfigError(
                f"job {job.name}: {folder}/.hydra/config.yaml cannot be read (cut off or "
                f"hand-edited); restore it, or delete {folder} to train the job again"
            )
        keys = sorted(set(ran) | set(job.options))
        differ = [
            k
            for k in keys
            if repr(ran.get(k, ADDED_LATER.get(k))) != repr(job.options.get(k, ADDED_LATER.get(k)))
        ]
        if differ:
            key = differ[0]
            raise ConfigError(
                f"job {job.name}: {folder} ran with {key}={ran.get(key)}, the study now gives "
                f"{key}={job.options.get(key)}; run the study's command as it was, or pass "
                "another --out for a new study"
            )


def check_no_job_running(out: Path, study: Study) -> None:
    """A job still trained by an earlier driver (killed, its jobs left running) is not started
    twice: its run folder's lock names the process."""
    from poslab.errors import RunBusy
    from poslab.run.run_folder import RunLock

    for job in study.jobs:
        folder = run_folder(out, job.name)
        if not folder.is_dir():
            continue
        lock = RunLock(folder)
        try:
            lock.acquire()
        except RunBusy as err:
            holder = str(err).split("(pid ", 1)[-1].split(")", 1)[0]
            raise ConfigError(
                f"job {job.name} is still being trained by pid {holder} (an earlier study "
                f"driver's job?); wait for it, or stop it (kill {holder}), then run this again"
            ) from None
        lock.put_back()
        lock.release()
