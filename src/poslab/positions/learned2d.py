"""Learned 2-D positions: a trainable table per axis (row, column), their rows added to the
tokens (factorised 2-D embeddings, as in ViT variants). Positions (…, T, 2); text gets the same
id on both axes. A row of a table that training never reached (a coordinate past the training
grid) is still its random initial vector: the baseline that cannot extrapolate."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from poslab.positions.base import Prepared
from poslab.positions.learned import LearnedPositions


class LearnedGrid(LearnedPositions):
    position_axes = 2

    def __init__(self, d_model: int, n_head: int, max_positions: int, **options: Any) -> None:
        super().__init__(d_model, n_head, max_positions, **options)
        self.columns = nn.Embedding(self.max_positions, d_model)  # `table` holds the rows
        nn.init.normal_(self.columns.weight, std=0.02)

    def positions(self, batch: int, seq_len: int, device: torch.device) -> Tensor:
        return self.text_positions(super().positions(batch, seq_len, device))

    def text_positions(self, positions: Tensor) -> Tensor:
        return positions[..., None].expand(*positions.shape, 2)

    def embed(self, x: Tensor, positions: Tensor | Prepared) -> Tensor:
        positions = self.prepared(positions).positions
        if positions.numel():
            self.check_length(int(positions.max()))
        index = positions.clamp(max=self.max_positions - 1).to(torch.long)
        added = self.table(index[..., 0]) + self.columns(index[..., 1])
        return x + added.to(x.dtype)
