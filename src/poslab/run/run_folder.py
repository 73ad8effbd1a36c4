"""A run's folder: the record of the command that made it, its lock, and status.json.

* Hydra records a command in `.hydra-pending-<uid>/` (conf/hydra/default.yaml), which becomes
  the run's `.hydra/` only once the run passed its checks and took the folder
  (`claim_run_folder`); until then a refusal can undo everything it wrote.
* One training process at a time per run folder (`RunLock`, a lock on `<run>/.lock`).
* `status.json` says how the run stands: running | completed | interrupted | failed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from poslab.errors import NO_SPACE_ERRNOS, ConfigError, RunBusy

try:  # POSIX; elsewhere runs go unlocked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

# where Hydra records a training command (hydra.output_subdir, one per process:
# .hydra-pending-<uid>) until the run takes its folder
PENDING_CONFIG = ".hydra-pending"
LOCK_FILE = ".lock"
# what Hydra (and the lock) put in a run folder before the task starts; a folder holding
# nothing else has seen no work yet
HYDRA_FILES = {".hydra", PENDING_CONFIG, LOCK_FILE, "train.log", "eval.log"}
STATUS_FILE = "status.json"
# what status.json says about the run's state (the rest are its metrics)
STATUS_KEYS = {"status", "time", "phase", "step", "resume", "resumed_from", "error"}
# the folder this job has taken (claim_run_folder); None while it may still be refused
_claimed: Path | None = None


def run_dir() -> Path:
    """This job's output folder (Hydra's), or the current folder outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


RUN_SETTINGS = "run.json"


def write_run_settings(
    folder: Path,
    cfg: Any,
    precision: str | None = None,
    machine: str | None = None,
    **lineage: str,
) -> None:
    """<run>/run.json: the resolved settings that tell runs apart (data, scheme, model, L,
    steps, seed, the precision `auto` resolved to, and the machine that trained it), read by
    scripts/runs.py and compare.py (.hydra/config.yaml keeps interpolations and `auto`); a child
    of extend= also its `lineage` (parent folder, checkpoint and its SHA-256)."""
    settings = {
        "run_name": cfg.get("run_name"),
        "data": cfg.data.get("name"),
        "scheme": cfg.get("pos_name"),
        "model": cfg.get("model_name"),
        "seq_len": cfg.data.get("seq_len"),
        "max_steps": cfg.trainer.get("max_steps"),
        "max_tokens": cfg.train.get("max_tokens"),
        "seed": cfg.get("seed"),
        "precision": precision,
        "machine": machine,
        **lineage,
    }
    tmp = folder / f".{RUN_SETTINGS}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(settings, indent=1) + "\n")
        os.replace(tmp, folder / RUN_SETTINGS)
    except OSError:  # a full disk: the listing's loss, never the run's
        tmp.unlink(missing_ok=True)


def write_status(folder: Path, status: str, name: str = STATUS_FILE, **details: Any) -> None:
    """<run>/status.json: running | completed | interrupted | failed, with details (step, error,
    the command that resumes it). Written through a temporary file, so it is never half-written.
    On a full disk, where no new file fits, the old one is overwritten in place (its disk block
    is already allocated), so a run that fails for lack of space still says `failed`."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {"status": status, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **details}
    data = (json.dumps(payload, indent=1) + "\n").encode()
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno not in NO_SPACE_ERRNOS or not (folder / name).is_file():
            raise
        with open(folder / name, "r+b") as f:
            f.write(data)
            f.truncate()


def read_status(folder: Path) -> dict[str, Any]:
    """<run>/status.json as a dict ({} where there is none or it cannot be read)."""
    try:
        return json.loads((folder / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def is_main_process() -> bool:
    """False in the extra processes a multi-process launcher starts (they share rank 0's run
    folder and must neither lock nor claim it)."""
    ranks = (
        "LOCAL_RANK",
        "NODE_RANK",
        "RANK",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
    )  # Lightning's launcher, torchrun, SLURM's srun, MPI
    return all(os.environ.get(k, "0") in ("", "0") for k in ranks)


class RunLock:
    """An exclusive lock on `<run>/.lock` for as long as a training process uses the folder: two
    `resume=` of one run would both train it (doubled work, best-v1.ckpt, best-v2.ckpt). The OS
    drops the lock when the process ends, even by SIGKILL, so a killed run never blocks its
    resume. The file holds the holder's pid, for the refusal line."""

    def __init__(
        self, folder: Path, lock: Path | None = None, user: str = "training process"
    ) -> None:
        # `lock` elsewhere than <folder>/.lock, `user` in the refusal: export_hf.py locks the
        # folder it writes from beside it (the folder itself appears only once whole)
        self.path = lock or folder / LOCK_FILE
        self.folder, self.user = folder, user
        self.fd: int | None = None
        self.created = False
        self.previous = b""  # the file's content before this process wrote its pid

    def acquire(self) -> None:
        if fcntl is None:
            return
        self.created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            self.created = False
            raise RunBusy(
                f"{self.folder} is in use by another {self.user} (pid {holder}); wait "
                f"for it to end, or stop it (kill {holder}) and run this again"
            ) from None
        self.previous = os.read(fd, 32)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def put_back(self) -> None:
        """Leave the lock file as this process found it (it was refused: it did no work)."""
        if self.fd is None:
            return
        if self.created:
            self.path.unlink(missing_ok=True)
        else:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, self.previous, 0)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def claim_run_folder(folder: Path) -> None:
    """The run passed its checks and takes its folder: Hydra's record of this command
    (.hydra-pending/) becomes the run's .hydra/, and the temporaries a killed writer left are
    removed (the lock says no other process writes here). From now on a failure is the run's
    own and is written to its status.json."""
    global _claimed
    pending = pending_record(folder)
    if pending.is_dir():
        (folder / ".hydra").mkdir(exist_ok=True)
        for path in pending.iterdir():
            os.replace(path, folder / ".hydra" / path.name)
        shutil.rmtree(pending, ignore_errors=True)
    for stale in [*folder.glob(".*.tmp"), *(folder / "checkpoints").glob(".*.tmp")]:
        stale.unlink(missing_ok=True)
    _claimed = folder
    outputs = next((p for p in folder.absolute().parents if p.name == "outputs"), None)
    if outputs is not None:
        point_latest(outputs, folder)


def point_latest(outputs: Path, run: Path) -> None:
    """`outputs/latest` -> the newest run's folder (a relative symlink, replaced atomically);
    a folder that cannot take it never fails the run."""
    link = outputs / "latest"
    tmp = outputs / f".latest.{os.getpid()}.tmp"
    try:
        target = os.path.relpath(run.absolute(), outputs.absolute())
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def untouched(folder: Path) -> bool:
    """True when the folder holds only what Hydra wrote before the task started."""
    try:
        names = {n for n in os.listdir(folder) if not n.startswith(PENDING_CONFIG)}
        return folder.is_dir() and names <= HYDRA_FILES
    except OSError:
        return False


def pending_record(folder: Path) -> Path:
    """This process's .hydra-pending-<uid>/ (Hydra's record of the command), or the plain
    .hydra-pending where Hydra's output_subdir is not set (in-process runs)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        subdir = HydraConfig.get().output_subdir
        if subdir and str(subdir).startswith(PENDING_CONFIG):
            return folder / str(subdir)
    return folder / PENDING_CONFIG


def resume_command(out: Path) -> str:
    return f"python train.py resume={shlex.quote(str(out))}"


def claimed_folder() -> Path | None:
    """The folder this job has taken (claim_run_folder), or None while it may still be refused."""
    return _claimed


def forget_claim() -> None:
    """A new job starts (an in-process sweep runs several): it has taken no folder yet."""
    global _claimed
    _claimed = None


def checkpoint_of_run(run: str | Path) -> Path:
    """The best checkpoint of a training run folder (last.ckpt if there is no best)."""
    folder = Path(run) / "checkpoints"
    for name in ("best.ckpt", "last.ckpt"):
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"run={run} has no checkpoints/best.ckpt or last.ckpt; pass ckpt=PATH")
