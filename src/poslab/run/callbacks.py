"""Lightning callbacks and plugins of the harness.

`LastCheckpoint` keeps `last.ckpt` fresh every `checkpoint.every_n_steps` steps and on SIGTERM /
SIGINT; `AtomicCheckpointIO` makes every checkpoint write all-or-nothing.

`LearningSpeed` records, on a generated task, the first validation step at which val/accuracy
reached its target (steps to learn, a result of its own) and, with `train.stop_at_accuracy`, ends
training there.

`RankFingerprints` (`++train.fingerprints=true`) makes a multi-process run checkable after the
fact: every rank writes `<run>/fingerprints/rank<k>.json` with digests of the training batches
it saw and of its parameters at the start and end of training. In a correct data-parallel run
the ranks saw different batches (poslab.sampling gives each rank its own part of every batch)
and end with identical parameters (DDP averages gradients, so all ranks take the
same optimizer steps). Digests are exact (SHA-256 of the raw bytes), so "identical" is bitwise.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint

from poslab.errors import NO_SPACE_ERRNOS, DiskFull, RunInterrupted


def tensor_digest(named: list[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes, in name order (any dtype, bf16 too)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class LearningSpeed(L.Callback):
    """The first validation step at which val/accuracy ≥ `target` goes to the module's
    `steps_to_learn` (stored in every later checkpoint); with `stop` the run ends there."""

    def __init__(self, target: float, stop: bool) -> None:
        self.target, self.stop = target, stop

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        accuracy = trainer.callback_metrics.get("val/accuracy")
        if trainer.sanity_checking or accuracy is None:
            return
        pl_module.learning_target = self.target
        if pl_module.steps_to_learn is None and float(accuracy) >= self.target:
            pl_module.steps_to_learn = int(trainer.global_step)
            print(
                f"val/accuracy {float(accuracy):.3f} ≥ {self.target} at step "
                f"{trainer.global_step}"
                + (": stopping (train.stop_at_accuracy)" if self.stop else ""),
                flush=True,
            )
        if self.stop and pl_module.steps_to_learn is not None and trainer.state.fn == "fit":
            trainer.should_stop = True


class RankFingerprints(L.Callback):
    """Writes `<folder>/rank<global rank>.json` when training ends: world size, step, batches,
    samples and tokens this rank trained on, a digest of each training batch (inputs, in order,
    12 hex digits: ~2 MB of JSON per 100k batches) and of all of them, and digests of the
    parameters and buffers at the start and end of training.

    It copies every batch to the CPU, which costs a little throughput on GPUs: a tool for
    checking a setup, off by default. Under FSDP a rank holds only its shards of the
    parameters, so its parameter digests describe those shards.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.batch_digests: list[str] = []
        # a hex string, not a hashlib object: ddp_spawn pickles callbacks into its processes
        self.all_batches = hashlib.sha256().hexdigest()
        self.samples = 0
        self.tokens = 0
        self.params_start: str | None = None

    @staticmethod
    def _state(module: L.LightningModule) -> list[tuple[str, torch.Tensor]]:
        return [*module.named_parameters(), *module.named_buffers()]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.params_start = tensor_digest(self._state(pl_module))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        inputs = batch[0].detach().to("cpu").contiguous()
        digest = hashlib.sha256(inputs.numpy().tobytes()).hexdigest()
        self.batch_digests.append(digest[:12])
        self.all_batches = hashlib.sha256((self.all_batches + digest).encode()).hexdigest()
        self.samples += int(inputs.shape[0])
        self.tokens += int(inputs.numel())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        record = {
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "batches": len(self.batch_digests),
            "samples": self.samples,
            "tokens": self.tokens,
            "batches_digest": self.all_batches,
            "params_start": self.params_start,
            "params_end": tensor_digest(self._state(pl_module)),
            "batch_digests": self.batch_digests,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(record, indent=1))


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def write_atomically(path: Path, data: bytes) -> None:
    """`data` to a temporary file in `path`'s own folder (never $TMPDIR: it may be small or on
    another disk), flushed to disk, then renamed over `path`: a kill or a full disk leaves the
    previous file intact and no temporary behind. No room: DiskFull naming the path and sizes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.errno not in NO_SPACE_ERRNOS:
            raise
        if err.errno == errno.EFBIG:  # a file-size limit, not the disk: its free space misleads
            room = f"{err.strerror}: a file-size limit (ulimit -f) is below it"
        else:
            room = f"{_mib(shutil.disk_usage(path.parent).free)} free on its disk"
        raise DiskFull(
            f"no room to write {path} ({_mib(len(data))} needed, {room}); free some space"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the `.NAME.PID.tmp` files a killed writer left in `folder` (call it only while
    holding the run's lock: then no other process is writing there)."""
    stale = sorted(folder.glob(".*.tmp")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints serialised in memory, then written through `write_atomically`: a kill during
    a save leaves the previous checkpoint intact, never a truncated file, and a full disk is one
    line (DiskFull) with the last good checkpoint untouched. (Lightning's own save stages the
    file in $TMPDIR, which fails when that is small although the run's disk has room.)"""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_atomically(Path(path), buffer.getvalue())


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LastCheckpoint(Checkpoint):
    """Keeps `last.ckpt` no more than `every_n_steps` optimizer steps old (and saves it at every
    validation and at the end of training), and turns SIGTERM (preemption) and SIGINT (Ctrl-C)
    into: finish this optimizer step, save `last.ckpt`, stop. A second signal stops at once.

    Saves happen only between optimizer steps (never inside gradient accumulation), so a resumed
    run continues at exactly the batch where this one stopped. (Lightning's SLURM
    `hpc_ckpt_N.ckpt`, saved whenever SIGUSR1 arrives, can fall inside an accumulation: with
    accumulate_grad_batches > 1 prefer SIGTERM or these periodic saves.)

    It is a `Checkpoint` so that Lightning runs it after ModelCheckpoint (checkpoint callbacks
    go last, in the order given): a save at a validation then stores the best-model state that
    includes this validation. Saved before it, a resumed run had a stale best score and wrote
    its real best to `best-v1.ckpt`, leaving `best.ckpt` the wrong model."""

    def __init__(self, path: str | Path, every_n_steps: int | None) -> None:
        self.path = Path(path)
        self.every_n_steps = every_n_steps
        self.signal: int | None = None  # the signal that asked this run to stop
        self.stopped_at: int | None = None  # the step saved when it stopped
        self._previous: dict[int, Any] = {}
        self._between_steps = True  # the last training batch ended an accumulation
        self._saved_step: int | None = None  # the step of the latest save
        self._trainer: L.Trainer | None = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # asked twice: stop now, with the last checkpoint saved
            self._restore_handlers(stopping=True)
            launcher = getattr(self._trainer, "strategy", None) and self._trainer.strategy.launcher
            if launcher is not None and hasattr(launcher, "kill"):
                launcher.kill(signal.SIGKILL)  # other ranks would wait in a collective forever
            saved = str(self.path) if self.path.is_file() else None
            raise RunInterrupted(signum, "training", self._saved_step, saved)
        self.signal = signum
        name = signal.Signals(signum).name
        print(
            f"\n{name}: saving a checkpoint after this step, then stopping ({name} again stops "
            "at once)",
            file=sys.stderr,
            flush=True,
        )

    def _restore_handlers(self, stopping: bool = False) -> None:
        """Put back the handlers from before training; while a stop is under way, ignore the
        signals instead: one more Ctrl-C must not cut the stop's report short (the job puts
        its handlers back once it has reported)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if stopping else handler)
        self._previous = {}

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path)
        self._saved_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._between_steps = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if not self._between_steps:
            return  # inside an accumulation: no optimizer step was taken
        stop = self.signal is not None
        if trainer.world_size > 1:  # every rank must stop at the same step
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        step = trainer.global_step
        if stop:
            self._save(trainer)
            self.stopped_at = step
            trainer.should_stop = True
        elif self.every_n_steps and step % self.every_n_steps == 0:
            self._save(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._between_steps:
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Restored here, not in teardown: Lightning restores its own handlers first in its
        # teardown, and ours would then put back its notifier, which swallows a later SIGTERM
        self._restore_handlers(stopping=self.signal is not None)
        if self._saved_step != trainer.global_step:  # the final state, unless saved already
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_handlers(stopping=isinstance(exception, RunInterrupted))
