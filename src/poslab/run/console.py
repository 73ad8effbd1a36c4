"""What a run prints: its own lines, each once, and not the libraries' small talk.

* Lightning's messages go through the one handler Hydra gives the root logger (console and
  `train.log`), not a second one of Lightning's own; tips, "TPU available" and checkpoint-loading
  notes that are not the user's business are dropped at their source.
* Deprecation warnings that third-party code raises inside third-party code are not shown.
* W&B prints no run summary at the end, so the last line after a run, or after a stop, is
  poslab's (where the files are, what to run next).
* A progress bar only on a terminal; every `trainer.log_every_n_steps` a line
  `step 250/500 | loss 5.31 | lr 1.9e-03 | 41 ms/step | 49.8k tok/s` (ConsoleLine), which is
  what a file or a cluster log keeps.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any

import lightning as L

log = logging.getLogger("poslab.run.training")

# messages of Lightning that say nothing about this run
NOISE = (
    "💡 Tip",
    "TPU available",
    "HPU available",
    "`weights_only` was not set",
    "LOCAL_RANK",
)
# third-party deprecations raised inside third-party code, not the user's
THIRD_PARTY_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\).*",
    r".*The anonymous setting has no effect.*",
    r".*Tight layout not applied.*",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in NOISE)


def quiet_libraries() -> None:
    """Lightning once through the root handler and without its small talk; third-party
    deprecations off; W&B quiet at the end of a run (a user's WANDB_QUIET/WANDB_SILENT win)."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                logger.removeHandler(handler)  # the root's handler prints it (and logs it)
        logger.propagate = True
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    for child in ("utilities.rank_zero", "trainer.connectors.checkpoint_connector"):
        for package in ("lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(f"{package}.{child}")
            if not any(isinstance(f, _DropNoise) for f in logger.filters):
                logger.addFilter(_DropNoise())
    for pattern in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    os.environ.setdefault("WANDB_QUIET", "true")


def on_a_terminal() -> bool:
    """Whether progress bars make sense: stderr is a terminal (not a file, a pipe, a log)."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar_setting(value: Any) -> bool:
    """trainer.enable_progress_bar: `auto` (the default) is a bar on a terminal only."""
    return on_a_terminal() if value in ("auto", None) else bool(value)


class ConsoleLine(L.Callback):
    """One line every `every` optimizer steps: step, loss, learning rate, time per step and
    tokens per second over the training steps since the last line (validations excluded)."""

    def __init__(self, every: int) -> None:
        self.every = max(1, int(every))
        self._since: tuple[float, int] | None = None
        self._last = -1
        self._validating_since = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._since = (time.perf_counter(), trainer.global_step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validating_since = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a validation during training says what it found and what it took: on a CPU it can be
        # tens of seconds after the last step line (the step-0 one is announced by training.py)
        fitting = trainer.state.fn == "fit"  # not trainer.validate() (step 0, eval.py)
        if fitting and not trainer.sanity_checking and trainer.is_global_zero:
            loss = trainer.callback_metrics.get("val/loss")
            took = time.perf_counter() - self._validating_since
            if loss is not None:
                log.info(
                    "validation at step %d: val/loss %.4f (%.0f s)",
                    trainer.global_step,
                    float(loss),
                    took,
                )
        # the next line times training steps only, not this validation
        self._since = (time.perf_counter(), trainer.global_step)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if step == self._last or step % self.every or not trainer.is_global_zero:
            return
        self._last = step
        now = time.perf_counter()
        started, first = self._since or (now, step)
        steps = max(1, step - first)
        per_step = (now - started) / steps
        accumulate = trainer.accumulate_grad_batches
        tokens = batch[0].numel() * trainer.world_size * accumulate
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else "?"
        log.info(
            "step %d/%s | loss %.4f | lr %.2e | %.0f ms/step | %s tok/s",
            step,
            total,
            float(loss) if loss is not None else float("nan"),
            lr,
            per_step * 1000,
            _short(tokens / per_step if per_step > 0 else 0.0),
        )
        self._since = (now, step)


def _short(value: float) -> str:
    """49800 -> '49.8k'."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"
