"""Scalable-Softmax, SSMax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention",
arXiv 2501.19399), trained with it from the start, over rotary (default) or over NoPE.

Softmax over n keys flattens as n grows (its largest output tends to 0: "attention fading").
SSMax replaces softmax(z) by softmax((s·log n)·z), i.e. n^(s·z_i) / Σ_j n^(s·z_j), with s a
learnable scalar per head and layer (the paper's; ``per_layer: false`` shares one set of heads
across layers): the logits grow with the log of the number of keys, which keeps attention
focused on long inputs. In causal attention the query at index t (counted from the window's
first token, whatever its position value) attends to n = t + 1 keys. Multiplying the logits by a
per-query factor is multiplying the query by it, so this is done at train and eval time in
``rotate``: q·(s·log n) in fp32 outside autocast, cast back to q's dtype, after rotary; every
softmax kernel then computes softmax(s·log n · q·k/√d). ``bias: true`` is the paper's variant
(s·log n + b)·z with b learnable per head (started at 0), which the paper reports trains faster
but extrapolates worse.

s starts at ``s_init``, 0.43 by default: the value of the paper's Figure 1 (the full text giving
the training initialisation could not be read when this was written). With ``rotary: false``
the scheme is NoPE + SSMax (no rotation; the rotary options are ignored, and an eval-time rope
scaling is refused). Linear attention refuses the scheme (``scales_scores``): it has no softmax
to sharpen. n counts tokens, not positions, so shifting every position changes nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from poslab.checks import boolean, number, require
from poslab.errors import ConfigError
from poslab.positions.base import Prepared
from poslab.positions.rope import Rotary


class SSMax(Rotary):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        rotary: bool = True,
        s_init: float = 0.43,
        bias: bool = False,
        per_layer: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(d_model, n_head, **options)
        require("pos.rotary", rotary, boolean())
        require("pos.s_init", s_init, number(gt=0))
        require("pos.bias", bias, boolean())
        require("pos.per_layer", per_layer, boolean())
        if not rotary and (self.scaling is not None or self.theta_param is not None):
            raise ConfigError(
                "pos.rotary=false rotates nothing, so eval.rope_scaling, eval.logn_scaling and "
                "pos.learnable_theta have nothing to act on; leave them off or set pos.rotary=true"
            )
        self.rotary = rotary
        self.per_layer = per_layer
        sets = self.n_layer if per_layer else 1
        self.s = nn.Parameter(torch.full((sets, n_head), float(s_init)))
        self.b = nn.Parameter(torch.zeros(sets, n_head)) if bias else None

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            keys = torch.arange(1, positions.shape[-1] + 1, device=positions.device)
            prepared.extra["ssmax_log_n"] = torch.log(keys.float())[:, None]  # (T, 1)
        return prepared

    def factor(self, log_n: Tensor, layer: int = 0) -> Tensor:
        """s·log n (+ b) per head and query, (H, T, 1) fp32, for log n (T, 1)."""
        i = self.layer_index(layer)
        factor = self.s[i].float()[:, None, None] * log_n
        if self.b is not None:
            factor = factor + self.b[i].float()[:, None, None]
        return factor

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        prepared = self.prepared(positions)
        if self.rotary:
            q, k = super().rotate(q, k, prepared, layer)
        with torch.autocast(device_type=q.device.type, enabled=False):
            factor = self.factor(prepared.extra["ssmax_log_n"], layer)
            q = (q.float() * factor).to(q.dtype)
        return q, k

    @property
    def reads_length(self) -> bool:
        return True  # log n counts the forward's tokens up to each query, not its position

    @property
    def scales_scores(self) -> bool:
        return True

    def metrics(self) -> dict[str, Tensor]:
        s = self.s.detach().float()
        out = {"ssmax_s_mean": s.mean(), "ssmax_s_min": s.min(), "ssmax_s_max": s.max()}
        if self.b is not None:
            out["ssmax_b_mean"] = self.b.detach().float().mean()
        return {**super().metrics(), **out}
