"""PoPE (Gopalakrishnan et al. 2025, arXiv 2509.10534, "Decoupling the 'What' and 'Where' With
Polar Coordinate Positional Embeddings"): each of a head's d query and key components becomes a
complex number whose magnitude says what (softplus of the component, never negative) and whose
phase says where (the position times one of d frequencies):

    q̃_tc = softplus(q_tc) · e^{i t θ_c},   k̃_sc = softplus(k_sc) · e^{i (s θ_c + δ_c)},
    score(t, s) = Re Σ_c q̃_tc · conj(k̃_sc) / √d = Σ_c μ_q μ_k cos((t − s) θ_c − δ_c) / √d,

θ_c = base^(−c/d) for c = 0..d−1 (d frequencies, where RoPE has d/2 pairs), δ a learned phase
per head and frequency (and per layer with `per_layer`), clamped to [−2π, 0] and starting at 0
as in the reference code. RoPE mixes content into the phase through its pairs; PoPE keeps the
phase for position alone.

Here q̃ and k̃ go to the attention kernel as real vectors of 2d dims, (μ cos φ, μ sin φ) per
component, so their dot product is the real part above, and every softmax kernel serves PoPE
unchanged (the values keep d dims). The kernels scale by 1/√(2d) from those widths; the
queries carry √2 to give the paper's 1/√d. Angles and magnitudes are fp32 whatever autocast
says. References: the PoPE-pytorch package (`pope.py`), x-transformers `PolarEmbedding`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import boolean, number, require
from poslab.positions.base import PositionalScheme, Prepared


class PolarPositions(PositionalScheme):
    shift_invariant: ClassVar[bool] = True
    widens_keys: ClassVar[bool] = True  # q and k leave `rotate` with 2 × head_dim dims

    def __init__(
        self,
        d_model: int,
        n_head: int,
        base: float = 10000.0,
        per_layer: bool = True,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.base", base, number(gt=1))
        require("pos.per_layer", per_layer, boolean())
        self.base, self.per_layer = float(base), per_layer
        exponents = torch.arange(self.head_dim, dtype=torch.float32) / self.head_dim
        self.register_buffer("inv_freq", float(base) ** -exponents, persistent=False)
        sets = self.n_layer if per_layer else 1
        self.phase = nn.Parameter(torch.zeros(sets, n_head, self.head_dim))

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            angles = prepared.fp32[..., None] * self.inv_freq  # (…, T, d)
            if angles.dim() == 3:  # per-sequence positions: a head axis
                angles = angles[:, None]
            prepared.extra["pope"] = angles
        return prepared

    def key_phase(self, layer: int) -> Tensor:
        """δ of a layer (H, 1, d) in [−2π, 0], fp32."""
        return self.phase[self.layer_index(layer)].float().clamp(-2 * math.pi, 0.0)[:, None]

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        angles = self.prepared(positions).extra["pope"]
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_polar = polar(F.softplus(q.float()), angles) * math.sqrt(2)
            k_polar = polar(F.softplus(k.float()), angles + self.key_phase(layer))
        return q_polar.to(q.dtype), k_polar.to(k.dtype)

    def metrics(self) -> dict[str, Tensor]:
        # how far the learned phases moved from their start at 0 (mean |δ|, radians)
        return {"pos/pope_phase_abs": self.phase.detach().clamp(-2 * math.pi, 0).abs().mean()}


def polar(magnitude: Tensor, angle: Tensor) -> Tensor:
    """(…, d) magnitudes and angles -> (…, 2d): (μ cos φ, μ sin φ) per component, so that the
    dot product of two such vectors is Σ μ μ' cos(φ − φ')."""
    return torch.cat((magnitude * torch.cos(angle), magnitude * torch.sin(angle)), dim=-1)
