"""Fixed sinusoidal positions of Vaswani et al. (2017), added to the token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)),  PE(p, 2i+1) = cos(p / base^(2i/d)); with `combine: concat`
the encoding has d = position_dims dims and is concatenated to the tokens (base.AbsoluteEmbedding).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from poslab.checks import number, require
from poslab.positions.base import AbsoluteEmbedding, PositionalScheme, Prepared, fp32_positions


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """(…, T, d_model) fp32 encoding of positions (…, T), sin on even dims and cos on odd."""
    p = fp32_positions(positions)
    inv_freq = base ** (
        -torch.arange(0, d_model, 2, device=p.device, dtype=torch.float32) / d_model
    )
    angles = p[..., None] * inv_freq
    table = torch.empty(*p.shape, d_model, device=p.device, dtype=torch.float32)
    table[..., 0::2] = torch.sin(angles)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return table


class SinusoidalPositions(PositionalScheme):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        base: float = 10000.0,
        scale: float | None = 1.0,
        combine: str = "add",
        position_dims: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.base", base, number(gt=1))
        require("pos.scale", scale, number(gt=0, null=True))
        self.base = float(base)
        self.joining = AbsoluteEmbedding(d_model, combine, position_dims)
        # 1.0: the original unit-amplitude encoding (Vaswani et al., fairseq). With GPT-style
        # std-0.02 token embeddings it dominates the input at first; model.scale_embeddings=true
        # (tokens x sqrt(d), as Vaswani and fairseq) balances the two. None: 1/sqrt(d_model),
        # x-transformers' choice for unscaled tokens.
        self.scale = 1.0 / math.sqrt(d_model) if scale is None else float(scale)

    def embed(self, x: Tensor, positions: Tensor | Prepared) -> Tensor:
        table = sinusoidal_table(self.prepared(positions).fp32, self.joining.width, self.base)
        return self.joining.join(x, table * self.scale)
