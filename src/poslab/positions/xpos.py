"""xPos (Sun et al. 2023, "A Length-Extrapolatable Transformer"): rotary plus an exponential
decay per rotated pair. Queries at position m are scaled by ζ_i^(m/γ) and keys at n by
ζ_i^(−n/γ), ζ_i = (2i/R + 0.4)/1.4 ∈ [0.29, 1), γ = `scale_base`, so the score of a pair carries
ζ_i^((m−n)/γ): it still depends on m − n alone, and high-frequency pairs (small ζ) fade with
distance. Reference: microsoft/torchscale `xpos_relative_position.py`.

The exponents are taken relative to the mean position of the sequence (a shift that cancels in
every score), so that ζ^(±m/γ) stays far from fp32's limits at long lengths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from poslab.checks import number, require
from poslab.errors import ConfigError
from poslab.positions.base import Prepared
from poslab.positions.rope import Rotary

# the largest decay factor that leaves fp16 q·k products headroom below its maximum (65504)
FP16_SAFE_SCALE = 100.0


class XPos(Rotary):
    def __init__(
        self, d_model: int, n_head: int, scale_base: float = 512.0, **options: Any
    ) -> None:
        super().__init__(d_model, n_head, **options)
        if self.needs == "scores":
            raise ConfigError(
                f"eval.rope_scaling.kind={self.scaling.kind} is defined for plain rotary "
                "(pos=rope), not xpos; use pi, ntk, dynamic_ntk, yarn, llama3 or longrope"
            )
        require("pos.scale_base", scale_base, number(gt=0))
        self.scale_base = float(scale_base)
        i = torch.arange(0, self.rotary_dims, 2, dtype=torch.float32)
        self.register_buffer("zeta", (i / self.rotary_dims + 0.4) / 1.4, persistent=False)

    def decay(self, positions_fp32: Tensor) -> tuple[Tensor, Tensor]:
        """Scales (…, T, R/2) of queries ζ^(m'/γ) and keys ζ^(−m'/γ), m' = m − mean(m)."""
        centered = positions_fp32 - positions_fp32.mean(dim=-1, keepdim=True)
        exponent = centered[..., None] / self.scale_base
        log_zeta = torch.log(self.zeta)
        return torch.exp(exponent * log_zeta), torch.exp(-exponent * log_zeta)

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            q_scale, k_scale = self.decay(prepared.fp32)
            if q_scale.dim() == 3:  # per-sequence positions: a head axis
                q_scale, k_scale = q_scale[:, None], k_scale[:, None]
            # one factor per rotated dim: both members of pair i get ζ_i's factor
            prepared.extra["xpos"] = tuple(self._per_dim(s) for s in (q_scale, k_scale))
        return prepared

    def _per_dim(self, scale: Tensor) -> Tensor:
        if self.pairing == "interleaved":
            return scale.repeat_interleave(2, dim=-1)
        return torch.cat((scale, scale), dim=-1)

    @property
    def reads_length(self) -> bool:
        return True  # the exponents are centred on the forward's mean position

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        prepared = self.prepared(positions)
        q, k = super().rotate(q, k, prepared, layer)
        q_scale, k_scale = prepared.extra["xpos"]
        if q.dtype == torch.float16 and max(q_scale.max(), k_scale.max()) > FP16_SAFE_SCALE:
            # ζ^(±m/γ) grows like e^(|m|/γ); fp16 (max 65504) would turn q or k into inf
            raise ConfigError(
                f"xpos at {prepared.fp32.shape[-1]} tokens scales q and k beyond what fp16 holds; "
                "use precision bf16-mixed or 32-true, or a larger pos.scale_base"
            )
        r = self.rotary_dims
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_part = (q[..., :r].float() * q_scale).to(q.dtype)
            k_part = (k[..., :r].float() * k_scale).to(k.dtype)
        if r == q.shape[-1]:
            return q_part, k_part
        return torch.cat((q_part, q[..., r:]), dim=-1), torch.cat((k_part, k[..., r:]), dim=-1)
