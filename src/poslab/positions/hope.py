"""HoPE (Chen et al. 2024, ACL 2025, "HoPE: A Novel Positional Encoding Without Long-Term Decay
for Enhanced Context Awareness and Extrapolation"): rotary on the high frequencies only, the cut
set by the training length.

A rotary pair whose wavelength λ_i = 2π/θ_i exceeds the training length L never completes one
period in training: over the trained distances it is a slow trend, not a periodic signal (the
source of RoPE's long-term decay), and the paper finds that such ("activated") low-frequency
components shape the U-shaped attention and the shortcut the model learns through them. HoPE
replaces them with position-independent components: θ_i = base^(−2i/R) where λ_i ≤ L, θ_i = 0
(the pair never turns: NoPE on it) where λ_i > L. So the cut moves with L: with head_dim 64 and
base 10⁴, L = 512 rotates 16 of the 32 pairs, L = 4096 rotates 23.

What is implemented is the abstract's definition ("replaces the specific components in RoPE
with position-independent ones, retaining only high-frequency signals") with the cut at one
period per training window; the paper's full text (which may place the cut or treat the
position-independent part differently) could not be read when this module was written.

L is ``data.seq_len``; a run with randomized positions up to N trains the angles to N, so pass
train_length = N there. θ is fixed (``learnable_theta`` is refused); HoPE differs from p_rope
only in how the cut is chosen (p_rope: a share of the pairs).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.positions.p_rope import keep_pairs, refuse_learnable_theta
from poslab.positions.rope import Rotary


def completes_a_period(rotary_dims: int, base: float, train_length: int) -> torch.Tensor:
    """(R/2,) bool: λ_i = 2π/θ_i ≤ L, in float64 (so that a wavelength at L is not moved
    across the cut by fp32 rounding)."""
    theta = base ** (-torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)
    return 2 * math.pi / theta <= train_length


class HoPE(Rotary):
    def __init__(self, d_model: int, n_head: int, train_length: int = 512, **options: Any) -> None:
        super().__init__(d_model, n_head, **options)
        refuse_learnable_theta(self, "hope", "the low frequencies stay at 0")
        require("pos.train_length", train_length, integer(1))
        self.train_length = train_length
        rotating = completes_a_period(self.rotary_dims, self.base, train_length)
        if not rotating.any():
            raise ConfigError(
                f"pos=hope at pos.train_length={train_length} rotates no pair: the shortest "
                f"wavelength, 2π/θ_0 = {2 * math.pi:.2f}, exceeds it; use a longer data.seq_len"
            )
        keep_pairs(self, rotating)
