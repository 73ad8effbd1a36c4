"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis"): a parameter-free bias from the inner product of sinusoidal position
embeddings, which decays (on average) with distance like ALiBi and needs no training.

    bias_h(m, n) = (Σ_{k=1..d'/2} cos((m − n) · 10000^(−2k/d')) − d'/2) / (8h / H),   h = 1..H

The sum is d'/2 at distance 0, so the bias is 0 there and ≤ 0 elsewhere; the −d'/2 shift is a
constant per row and does not change attention. The head scale follows NVIDIA NeMo's
implementation (`sandwich_relative_position_embedding.py`). d' = `dim` (the model width if
null).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.positions.base import PositionalScheme, fp32_positions


def _even(value: int | None) -> str | None:
    if value is None or value % 2 == 0:
        return None
    return "must be even (d'/2 pairs of sinusoids), e.g. the model width"


class Sandwich(PositionalScheme):
    needs = "bias"
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, dim: int | None = None, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.dim", dim, integer(2, null=True))
        # d'/2 cosines must sum to d'/2 at distance 0 (a zero bias there): d' is even
        require("pos.dim", dim, _even)
        if dim is None and d_model % 2:
            raise ConfigError(
                f"pos.dim=null takes model.d_model={d_model}, which is odd; Sandwich needs an "
                "even d' (pairs of sinusoids): set pos.dim to an even number"
            )
        self.dim = int(dim or d_model)
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float32)
        # derived state (not weights): frequencies and per-head scales
        self.register_buffer("freqs", 10000.0 ** (-2.0 * k / self.dim), persistent=False)
        scales = torch.arange(1, n_head + 1, dtype=torch.float32) * 8.0 / n_head
        self.register_buffer("head_scale", scales, persistent=False)

    def profile(self, distance: Tensor) -> Tensor:
        """(Σ_k cos(δ·ω_k) − d'/2) for distances δ (any shape), fp32, without head scale."""
        out = torch.zeros_like(distance)
        for freq in self.freqs:  # a loop over d'/2 terms keeps memory at the size of `distance`
            out += torch.cos(distance * freq)
        return out - self.dim / 2

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        return self.profile(q_position - k_position) / self.head_scale[head]

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, layer: int = 0) -> Tensor:
        """The bias depends on the distance alone: for integer positions it is computed once per
        distinct distance and gathered (exact, and Tq+Tk instead of Tq·Tk cosine sums)."""
        with torch.autocast(device_type=q_positions.device.type, enabled=False):
            q = fp32_positions(q_positions)[..., :, None]
            k = fp32_positions(k_positions)[..., None, :]
            distance = q - k
            if not torch.equal(distance, distance.round()):  # fractional positions
                return super().attention_bias(q_positions, k_positions, layer)
            low, high = int(distance.min()), int(distance.max())
            table = self.profile(torch.arange(low, high + 1, device=q.device).float())
            values = table[(distance - low).long()]  # (…, Tq, Tk)
            return values.unsqueeze(-3) / self.head_scale[:, None, None]
