"""Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of
Large Language Models"): rotary with every wavelength rounded to an integer.

λ_i = 2π/θ_i is rounded to the nearest integer and the frequency follows:
θ'_i = 2π / round(2π/θ_i), θ_i = base^(−2i/R). A pair then turns by exactly one period every
λ'_i tokens, so the angle at position m + λ'_i equals the angle at m and the features a pair
shows at any position, however far past the training length, are ones it showed in training
(those with λ'_i ≤ L) — the paper's remedy for out-of-distribution rotary features in
extrapolation. The reference (sheryc/resonance_rope, ``ResonanceRotaryEmbedding``) rounds the
wavelengths of all pairs, not only those below the training length (above it the rounding moves
θ by less than 1/(2λ) relatively and changes almost nothing), and so does this module.

As the reference does, the angles are computed from the position modulo the wavelength,
(m mod λ'_i)·θ'_i: exact in fp32 for integer positions below 2**24, so the period is exact too
(m·θ'_i in fp32 drifts from it at large m). An eval-time rope scaling (eval.rope_scaling) applies
to the rounded θ' and the plain product m·θ' (the paper's Resonance-YaRN rounds after YaRN's
scaling instead: not implemented here). θ is fixed (``learnable_theta`` is refused).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from poslab.positions.p_rope import refuse_learnable_theta
from poslab.positions.rope import Rotary


def resonance_wavelengths(rotary_dims: int, base: float) -> Tensor:
    """round(2π/θ_i) for θ_i = base^(−2i/R), in fp32 (integers, exact below 2**24)."""
    theta = base ** (-torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)
    return torch.round(2 * math.pi / theta).float()


class ResonanceRope(Rotary):
    def __init__(self, d_model: int, n_head: int, **options: Any) -> None:
        super().__init__(d_model, n_head, **options)
        refuse_learnable_theta(self, "resonance", "its wavelengths are integers")
        wavelengths = resonance_wavelengths(self.rotary_dims, self.base)
        self.register_buffer("wavelengths", wavelengths, persistent=False)
        self.set_theta((2 * math.pi / wavelengths.double()).float())

    def angles(self, positions: Tensor, length: int | None = None) -> Tensor:
        """(m mod λ'_i)·θ'_i (fp32), or rope's m·θ' under an eval-time scaling or the bf16
        position ablation."""
        if self.scaling is not None or self.position_dtype != "fp32":
            return super().angles(positions, length)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            phase = torch.remainder(positions.float()[..., None], self.wavelengths)
            return phase * self.frequencies()
