"""An example of a researcher's own positional scheme, outside poslab (docs/own-scheme.md).

A logarithmic ALiBi: score(q_m, k_n) += -scale · slope_h · log(1 + (m − n)), ALiBi's slopes per
head. The penalty grows ever more slowly with distance, so far tokens stay within reach.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from poslab.checks import number, require
from poslab.positions import PositionalScheme
from poslab.positions.alibi import alibi_slopes


class LogDistance(PositionalScheme):
    needs = "bias"  # the kernel adds `score_bias` to the scores
    shift_invariant: ClassVar[bool] = True  # depends on m − n only (poslab-check-scheme tests it)

    def __init__(self, d_model: int, n_head: int, scale: float = 1.0, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)  # the options every scheme takes
        require("pos.scale", scale, number(gt=0))  # bad input: one line naming the option
        self.scale = float(scale)
        # derived state: a non-persistent buffer, rebuilt from the config (never in checkpoints)
        slopes = torch.tensor(alibi_slopes(n_head), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        # positions arrive in fp32; masked (future) keys give m − n < 0: clamped, never NaN
        distance = (q_position - k_position).clamp(min=0)
        return -self.scale * self.slopes[head] * torch.log1p(distance)
