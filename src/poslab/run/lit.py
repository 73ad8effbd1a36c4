"""The LightningModule: training step, AdamW with warmup + cosine decay, logging."""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from poslab.errors import ConfigError, TrainingDiverged
from poslab.model.build import build_model
from poslab.model.losses import IGNORE_INDEX, linear_cross_entropy

log = logging.getLogger(__name__)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup from 0 to 1, then cosine decay to `min_lr_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps_for(warmup_steps: int, total_steps: int) -> int:
    """optim.warmup_steps, but at most a fifth of the run: a 60-step run with the default 100
    warm-up steps would never reach its learning rate and learn nothing."""
    cap = max(1, total_steps // 5)
    if warmup_steps > cap:
        log.warning(
            "optim.warmup_steps=%d is more than a fifth of the %d training steps; warming up for "
            "%d steps",
            warmup_steps,
            total_steps,
            cap,
        )
        return cap
    return warmup_steps


def fused_adamw_supported(device: torch.device) -> bool:
    """The fused AdamW kernel (one kernel for all parameters): CUDA, and CPUs from torch 2.4,
    where it is ~2× faster than the default for-each implementation."""
    if device.type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return device.type == "cpu" and (major, minor) >= (2, 4)


def _numpy_state_to_plain(state: tuple) -> list:
    kind, keys, pos, has_gauss, cached = state
    return [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), pos, has_gauss, cached]


def _numpy_state_from_plain(state: list) -> tuple:
    kind, keys, pos, has_gauss, cached = state
    return kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached


class LanguageModel(L.LightningModule):
    """Wraps a GPT built from the resolved run config, which it stores in every checkpoint
    (`hyper_parameters["config"]`), so the model can be rebuilt from the checkpoint alone."""

    def __init__(self, config: dict[str, Any], vocab_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = build_model(config, vocab_size)
        if (config.get("trainer") or {}).get("compile"):
            # compile the network body; the fused chunked loss stays eager (its chunk loop is
            # already a few large matmuls). The state dict keeps its plain names.
            self.model.hidden_states = torch.compile(self.model.hidden_states)
        self.optim = config["optim"]
        # a generated task: validation also scores the answers (val/accuracy, exact match)
        self.is_task = "task" in (config.get("data") or {})
        # the first validation step at which val/accuracy reached learning_target (None: not
        # yet); set by poslab.run.callbacks.LearningSpeed, stored in checkpoints
        self.steps_to_learn: int | None = None
        self.learning_target: float | None = None
        self._matrix_names = {n for n, p in self.model.named_parameters() if p.dim() >= 2}
        self._last_step_time: float | None = None
        # the run's tokenizer (TokenCache.tokenizer_record), kept in every checkpoint: evaluation
        # scores with it, never with one retrained on a corpus that may have changed
        self.tokenizer_record: dict[str, Any] | None = None
        # every step's tokens/s of this process (validations left out): the run's median is
        # its throughput in status.json (poslab.study reports MFU from it)
        self.step_rates: list[float] = []
        # the first step whose loss was not finite (-1: none). On a GPU it is recorded on the
        # device and read only every log_every_n_steps and before a checkpoint is written, so
        # the check costs no host sync per step.
        self._first_nonfinite_step: Tensor | None = None

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.model(idx, positions)

    def _loss(self, batch: tuple[Tensor, ...]) -> Tensor:
        """(inputs, targets), or (inputs, targets, positions (B, T, A)) from data with position
        axes (a grid): a multi-axis scheme reads them, a 1-D one takes the token index."""
        inputs, targets, *positions = batch
        given = positions[0] if positions and self.model.pos.position_axes else None
        return self.model.loss(inputs, targets, given)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self._watch_loss(loss)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        now = time.perf_counter()
        if self._last_step_time is not None:
            tokens = batch[0].numel() * self.trainer.world_size
            rate = tokens / (now - self._last_step_time)
            self.step_rates.append(rate)
            self.log("train/tokens_per_s", rate, prog_bar=True)
        self._last_step_time = now
        for name, value in self.model.pos.metrics().items():
            self.log(f"pos/{name}", value)
        return loss

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        if not self.is_task:
            self.log("val/loss", self._loss(batch), prog_bar=True, sync_dist=True)
            return
        inputs, targets, *positions = batch
        given = positions[0] if positions and self.model.pos.position_axes else None
        hidden = self.model.hidden_states(inputs, given)
        weight = self.model.lm_head.weight
        loss = linear_cross_entropy(hidden, weight, targets)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        # exact match of the scored targets (the answer, with data.loss_on=answer): the score
        # evaluation gives, by the argmax at every answer position
        scored = targets != IGNORE_INDEX
        wrong = torch.zeros_like(scored)
        wrong[scored] = (hidden[scored].float() @ weight.float().T).argmax(-1) != targets[scored]
        exact = (~wrong.any(dim=1))[scored.any(dim=1)].float()
        self.log("val/accuracy", exact.mean(), prog_bar=True, sync_dist=True, batch_size=len(exact))

    def on_validation_epoch_end(self) -> None:
        val_loss = self.trainer.callback_metrics.get("val/loss")
        if val_loss is not None:
            self.log("val/ppl", torch.exp(val_loss.float()), sync_dist=True)
        self._last_step_time = None  # validation time is not training throughput

    # -- divergence ---------------------------------------------------------------------------

    def _watch_loss(self, loss: Tensor) -> None:
        """Stop at the first non-finite training loss (a CPU checks every step; a GPU records it
        on the device and checks every log_every_n_steps, and before every checkpoint). With
        several processes the ranks decide together, so that none waits in a collective for a
        rank that stopped."""
        step = self.trainer.global_step
        bad = ~torch.isfinite(loss.detach())
        if loss.device.type == "cpu":
            if self._any_rank(bool(bad.item())):
                self._diverged(f"train/loss is {loss.item()} at step {step}")
            return
        if self._first_nonfinite_step is None:
            self._first_nonfinite_step = torch.full((), -1, device=loss.device)
        first = self._first_nonfinite_step
        self._first_nonfinite_step = torch.where(bad & (first < 0), step, first)
        if step % max(1, self.trainer.log_every_n_steps) == 0:
            self._check_recorded_loss()

    def _any_rank(self, flag: bool) -> bool:
        if self._trainer is None or self.trainer.world_size == 1:
            return flag
        return bool(self.trainer.strategy.reduce_boolean_decision(flag, all=False))

    def _check_recorded_loss(self) -> None:
        if self._first_nonfinite_step is not None:
            first = int(self._first_nonfinite_step.item())
            if self._any_rank(first >= 0):
                where = f"at step {first}" if first >= 0 else "on another rank"
                self._diverged(f"train/loss became non-finite {where}")

    def _diverged(self, what: str) -> None:
        raise TrainingDiverged(what)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Never write a diverged model over the last good checkpoint; store the RNG states and
        the W&B run id, so a resumed run continues the same random stream and the same W&B run."""
        self._check_recorded_loss()
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TrainingDiverged(f"the weights are non-finite at step {self.trainer.global_step}")
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # plain types and tensors only, so checkpoints load with weights_only=True
            "numpy": _numpy_state_to_plain(np.random.get_state()),
            "python": random.getstate(),
        }
        checkpoint["learning"] = {
            "steps_to_learn": self.steps_to_learn,
            "target": self.learning_target,
        }
        if self.tokenizer_record is not None:
            checkpoint["tokenizer"] = self.tokenizer_record
        logger = self.logger if self._trainer is not None else None
        if logger is not None and type(logger).__name__ == "WandbLogger":
            checkpoint["wandb_run_id"] = logger.version

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # a checkpoint of an earlier version: what is now derived state is dropped
        state = checkpoint["state_dict"]
        upgraded = self.model.pos.upgrade_state(state, prefix="model.pos.")
        if set(upgraded) - set(state) and checkpoint.get("optimizer_states"):
            # a parameter changed form: its optimizer state still has the old shape
            raise ConfigError(
                "this checkpoint predates the scheme's current parameters, so its optimizer "
                "state cannot be resumed; evaluate it with eval.py, or start a new run"
            )
        checkpoint["state_dict"] = upgraded
        learning = checkpoint.get("learning") or {}
        self.steps_to_learn = learning.get("steps_to_learn")
        self.learning_target = learning.get("target")
        # In DDP every rank resumes with rank 0's states (only rank 0 writes checkpoints): this
        # matters only for dropout masks; the data order does not use these generators.
        states = checkpoint.get("rng_states")
        if not states:
            return
        torch.set_rng_state(states["torch"])
        if states["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"][: torch.cuda.device_count()])
        np.random.set_state(_numpy_state_from_plain(states["numpy"]))
        random.setstate(states["python"])

    def _use_fused_adamw(self) -> bool:
        """Fused AdamW where gradients reach it unscaled: not with fp16's loss scaler (the fused
        kernel would unscale after clipping) nor FSDP (which clips shards itself)."""
        if not fused_adamw_supported(self.device):
            return False
        strategy = type(self.trainer.strategy).__name__ if self._trainer is not None else ""
        precision = str(self.trainer.precision) if self._trainer is not None else "32-true"
        return "FSDP" not in strategy and precision in ("32-true", "bf16-mixed", "32")

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning refuses to clip for any "fused" optimizer, because fp16's fused kernels
        # unscale gradients inside step(); _use_fused_adamw only fuses without a loss scaler,
        # where the gradients are already true gradients, so clipping them here is exact.
        if not optimizer.defaults.get("fused") or not gradient_clip_val:
            return super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def configure_optimizers(self) -> dict[str, Any]:
        opt = self.optim
        # no weight decay on biases, norms, or the positional scheme's own parameters (a decayed
        # learnable θ or bias table would drift toward zero for no reason). The scheme's
        # parameters get lr × pos_lr_scale: Adam moves a parameter by about lr per step, so a
        # zero-initialised T5 bias table cannot reach useful magnitudes in a short run.
        # Groups go by parameter name, recorded before any wrapping: FSDP shows every parameter
        # as a flat 1-D shard by now, so p.dim() would put all of them in no_decay.
        decay, no_decay, pos_params = [], [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            name = name.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "")
            if name.startswith("pos."):
                pos_params.append(p)
            else:
                (decay if name in self._matrix_names else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": opt["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        if pos_params:
            lr = opt["lr"] * opt.get("pos_lr_scale", 1.0)
            groups.append({"params": pos_params, "weight_decay": 0.0, "lr": lr})
        optimizer = torch.optim.AdamW(
            groups,
            lr=opt["lr"],
            betas=tuple(opt["betas"]),
            eps=opt["eps"],
            fused=self._use_fused_adamw() or None,
        )
        total = self.trainer.max_steps
        warmup = warmup_steps_for(opt["warmup_steps"], total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: warmup_cosine(step, warmup, total, opt["min_lr_ratio"]),
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
