"""`ntk`, NTK-aware scaling (bloc97 2023): base → base·s^(R/(R−2)), i.e. θ_i → θ_i·s^(−2i/(R−2)):
the highest frequency is kept, the lowest is interpolated by exactly s."""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension


def ntk_theta(theta: Tensor, rotary_dims: int, scale: float, kind: str) -> Tensor:
    """θ_i·α^(−2i/R) with α = scale^(R/(R−2)): base·α, for any trained θ."""
    if rotary_dims <= 2:
        raise ConfigError(
            f"eval.rope_scaling.kind={kind} changes the base by R/(R − 2), undefined for "
            f"R = {rotary_dims} rotated dims; rotate more dims (pos.fraction) or use pi"
        )
    i = torch.arange(theta.shape[-1], dtype=torch.float32, device=theta.device)
    alpha = scale ** (rotary_dims / (rotary_dims - 2))
    return theta * alpha ** (-2 * i / rotary_dims)


class NTKScaling(Extension):
    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        return ntk_theta(theta, rotary_dims, self.factor, "ntk")
