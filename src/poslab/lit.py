"""The LightningModule: training step, AdamW with warmup + cosine decay, logging."""

from __future__ import annotations

import math
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.build import build_model


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup from 0 to 1, then cosine decay to `min_lr_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LanguageModel(L.LightningModule):
    """Wraps a GPT built from the resolved run config, which it stores in every checkpoint
    (`hyper_parameters["config"]`), so the model can be rebuilt from the checkpoint alone."""

    def __init__(self, config: dict[str, Any], vocab_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = build_model(config, vocab_size)
        self.optim = config["optim"]
        self._last_step_time: float | None = None

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.model(idx, positions)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = self.model(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        now = time.perf_counter()
        if self._last_step_time is not None:
            tokens = batch[0].numel() * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / (now - self._last_step_time), prog_bar=True)
        self._last_step_time = now
        for name, value in self.model.pos.metrics().items():
            self.log(f"pos/{name}", value)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        val_loss = self.trainer.callback_metrics.get("val/loss")
        if val_loss is not None:
            self.log("val/ppl", torch.exp(val_loss.float()), sync_dist=True)
        self._last_step_time = None  # validation time is not training throughput

    def configure_optimizers(self) -> dict[str, Any]:
        opt = self.optim
        # no weight decay on biases, norms, or the positional scheme's own parameters (a decayed
        # learnable θ or bias table would drift toward zero for no reason). The scheme's
        # parameters get lr × pos_lr_scale: Adam moves a parameter by about lr per step, so a
        # zero-initialised T5 bias table cannot reach useful magnitudes in a short run.
        pos_params = [p for p in self.model.pos.parameters() if p.requires_grad]
        pos_ids = {id(p) for p in pos_params}
        decay, no_decay = [], []
        for p in self.model.parameters():
            if not p.requires_grad or id(p) in pos_ids:
                continue
            (decay if p.dim() >= 2 else no_decay).append(p)
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
            fused=self.device.type == "cuda" or None,
        )
        total = self.trainer.max_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: warmup_cosine(step, opt["warmup_steps"], total, opt["min_lr_ratio"]),
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
