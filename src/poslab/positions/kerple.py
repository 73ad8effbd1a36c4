"""KERPLE (Chi et al. 2022): a kernelized relative bias with learnable positive parameters.

    log:   bias_h(m, n) = −r1_h · log(1 + r2_h · |m − n|)
    power: bias_h(m, n) = −r1_h · |m − n|^r2_h,   0 < r2 ≤ 2

r1, r2 > 0 are learned per head (and per layer with `per_layer=true`, as the paper's code does:
each attention layer has its own). As in the reference code (chijames/KERPLE), r1 starts
uniform in (0, 2) and r2 in (0, 1) (log) or (0, 2) (power), and both are kept ≥ 0.01 (and
r2 ≤ 2 for power), here by clamping in the computation instead of rewriting the parameters (a
parameter pushed past a bound gets no gradient while it stays there). Both kernels are
conditionally positive definite, so the bias is 0 at distance 0 and falls monotonically with
distance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import boolean, choice, require
from poslab.positions.base import PositionalScheme

VARIANTS = ("log", "power")
EPS = 1e-2


class Kerple(PositionalScheme):
    needs = "bias"
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        variant: str = "log",
        per_layer: bool = True,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.variant", variant, choice(*VARIANTS))
        require("pos.per_layer", per_layer, boolean())
        self.variant = variant
        self.per_layer = per_layer
        sets = self.n_layer if per_layer else 1
        self.r1 = nn.Parameter(torch.rand(sets, n_head) * 2)
        self.r2 = nn.Parameter(torch.rand(sets, n_head) * (2 if variant == "power" else 1))

    def parameters_of(self, layer: int) -> tuple[Tensor, Tensor]:
        """(r1, r2) of a layer, in their allowed ranges, fp32."""
        i = self.layer_index(layer)
        r1 = self.r1[i].float().clamp(min=EPS)
        r2 = self.r2[i].float().clamp(min=EPS)
        return r1, (r2.clamp(max=2.0) if self.variant == "power" else r2)

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        return self.flex_score_bias(layer)(head, q_position, k_position)

    def flex_score_bias(self, layer: int = 0) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        r1, r2 = self.parameters_of(layer)  # clamped here, each indexed once below

        def bias(head: Tensor, q_position: Tensor, k_position: Tensor) -> Tensor:
            distance = (q_position - k_position).abs()
            if self.variant == "log":
                return -r1[head] * torch.log1p(r2[head] * distance)
            return -r1[head] * distance.pow(r2[head])

        return bias

    def metrics(self) -> dict[str, Tensor]:
        r1, r2 = self.parameters_of(0)
        return {"r1_mean": r1.detach().mean(), "r2_mean": r2.detach().mean()}
