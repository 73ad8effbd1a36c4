"""ALiBi (Press, Smith, Lewis 2022): a head-specific linear penalty on query-key distance.

score(q_m, k_n) += -slope_h · (m - n). Slopes follow the paper's rule for any head count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import boolean, require
from poslab.positions.base import PositionalScheme


def alibi_slopes(n_head: int) -> list[float]:
    """Geometric slopes 2^(-8/n), 2^(-16/n), ... ; for n not a power of two, the slopes of the
    nearest lower power of two p followed by every other slope of the 2p-head sequence."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_head <= 0:
        raise ValueError(f"n_head must be positive, got {n_head}")
    p = 2 ** math.floor(math.log2(n_head))
    if p == n_head:
        return power_of_two_slopes(n_head)
    return power_of_two_slopes(p) + power_of_two_slopes(2 * p)[0::2][: n_head - p]


class ALiBi(PositionalScheme):
    needs = "bias"
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self, d_model: int, n_head: int, learnable_slopes: bool = False, **common: Any
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.learnable_slopes", learnable_slopes, boolean())
        slopes = torch.tensor(alibi_slopes(n_head), dtype=torch.float32)
        # The paper found trainable slopes extrapolate worse; kept as an ablation switch.
        if learnable_slopes:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes, persistent=False)  # rebuilt from the rule

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        return self.flex_score_bias(layer)(head, q_position, k_position)

    def flex_score_bias(self, layer: int = 0) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        slopes = self.slopes.float()  # learnable or not, indexed once
        return lambda head, q_position, k_position: -slopes[head] * (q_position - k_position)
