"""Helpers of the system tests that start train.py / eval.py as processes (tests/e2e/): the
command of a resumable run, starting one and waiting for its first checkpoint, stopping it with
signals, reading its status and its error lines."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import REPO, TINY

# a run long enough to be stopped part-way: 60 steps, a checkpoint every 5; one precision
# whatever the machine (precision=auto is tested on its own: tests/model/test_precision.py)
RESUMABLE = [
    *[o for o in TINY if not o.startswith(("trainer.max_steps", "logger="))],
    "trainer.max_steps=60",
    "checkpoint.every_n_steps=5",
    "eval.after_train=false",
    "trainer.precision=32-true",
]


def train_cmd(corpus: Path, folder: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        f"data.path={corpus}",
        *RESUMABLE,
        *extra,
        f"hydra.run.dir={folder}",
    ]


def wandb_env(home: Path) -> dict[str, str]:
    """W&B offline (no credentials), its files under the run folder."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return {**env, "HOME": str(home), "NETRC": str(home / "none"), "WANDB_MODE": "offline"}


def wandb_view(folder: Path) -> tuple[dict, dict]:
    """W&B's own reader of the .wandb log `wandb sync` uploads, on the one offline run under
    `folder`: (its --summary object, its run record)."""
    (path,) = folder.glob("offline-run-*")

    def leet(*args: str) -> str:
        command = [sys.executable, "-m", "wandb", "leet", "inspect", *args, str(path)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    summary = json.loads(leet("--summary", "--json"))
    records = [json.loads(line) for line in leet("--json").splitlines() if line.strip()]
    (run,) = [r["run"] for r in records if r.get("type") == "run"]
    return summary, run


def final_val_loss(folder: Path) -> float:
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "completed", status
    return status["val_loss"]


def wandb_run_ids(folder: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[-1] for p in (folder / "wandb").glob("offline-run-*"))


def start_and_wait_for_checkpoint(
    cmd: list[str],
    folder: Path,
    env: dict | None = None,
    until: Any = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Start a training run and return once its first periodic checkpoint is on disk (or once
    `until()` is true)."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd or folder.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
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


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file of a folder and its content hash: 'unchanged' means byte for byte."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def val_losses(folder: Path) -> list[tuple[int, float]]:
    """(step, val/loss) of every validation the CSV logger recorded, across resumes."""
    rows = []
    for path in sorted(folder.glob("csv/**/metrics.csv")):
        with open(path) as f:
            rows += [
                (int(r["step"]), float(r["val/loss"]))
                for r in csv.DictReader(f)
                if r.get("val/loss")
            ]
    return rows


def _limit_file_size(limit: int):  # noqa: ANN202 -- a preexec_fn
    # writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ): a real "no room"
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def train_argv(corpus: Path, folder: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        f"data.path={corpus}",
        *RESUMABLE,
        "logger=csv",
        *extra,
        f"hydra.run.dir={folder}",
    ]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """Bad input before any work: one stderr line, `error: ...`, exit code 2."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


def last_error_line(result: subprocess.CompletedProcess) -> str:
    """A failure once training runs (Lightning's own INFO lines came before it): exit code 2,
    the last line `error: ...`, the only such line, and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith("error: "), result.stderr[-3000:]
    assert sum(line.startswith("error: ") for line in lines) == 1
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


def copy_of_the_repository(root: Path) -> Path:
    """The checkout as the tests read it (src/, tests/, scripts/, docs/, the root files),
    without its history, run folders and caches."""
    top = {".git", "outputs", "build", "dist", "wandb", ".cache", ".benchmarks"}
    caches = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache")

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = caches(folder, names)
        return skipped | (top & set(names)) if Path(folder) == REPO else skipped

    shutil.copytree(REPO, root, ignore=ignore, dirs_exist_ok=True)
    return root


def run(args: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """A command of the copy: its src/ first on the path (before the checkout's poslab)."""
    env = {**os.environ, "PYTHONPATH": str(cwd / "src"), "WANDB_MODE": "offline"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", POSLAB_CACHE=str(cwd / "cache"))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


class StepCounter:
    """A callback a user adds by config (`+callbacks.counter={_target_: ...}`): it writes the
    optimizer steps it saw to `path`."""

    def __new__(cls, path: str):  # a lightning Callback, built without importing Lightning here
        import lightning as L

        class Counter(L.Callback):
            def __init__(self) -> None:
                self.steps = 0

            def on_train_batch_end(self, trainer, *args) -> None:
                self.steps += 1

            def on_train_end(self, trainer, pl_module) -> None:
                with open(path, "w") as f:
                    f.write(str(self.steps))

        return Counter()
