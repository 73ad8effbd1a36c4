"""A study's folder: <out>/runs/<job>/ is each job's run folder, whose status.json and last
checkpoint say how far the job got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poslab.study.recipe import Study


def run_folder(out: Path, name: str) -> Path:
    return out / "runs" / name


def job_status(out: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((run_folder(out, name) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


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
    """Each job's done fraction: 1 for a completed run, its last checkpoint's share of the steps
    for a cut-off one, 0 for none."""
    progress = {}
    for job in study.jobs:
        status = job_status(out, job.name)
        if status.get("status") == "completed":
            progress[job.name] = 1.0
        elif step := checkpoint_step(run_folder(out, job.name)):
            progress[job.name] = min(0.99, step / job.config["trainer"]["max_steps"])
    return progress
