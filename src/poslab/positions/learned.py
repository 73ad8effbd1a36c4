"""Learned absolute positions: a trainable table of `max_positions` vectors added to the tokens
(or, with `combine: concat`, concatenated to them: base.AbsoluteEmbedding)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.positions.base import AbsoluteEmbedding, PositionalScheme, Prepared

BEYOND_TABLE = ("error", "clamp")


class LearnedPositions(PositionalScheme):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        max_positions: int,
        beyond_table: str = "error",
        combine: str = "add",
        position_dims: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.max_positions", max_positions, integer(1))
        if beyond_table not in BEYOND_TABLE:
            raise ConfigError(f"pos.beyond_table={beyond_table!r}; choose one of {BEYOND_TABLE}")
        self.max_positions = int(max_positions)
        # "clamp" reuses the last row for every position past the table: an explicit opt-in,
        # since a learned table has nothing to say about positions it never saw.
        self.beyond_table = beyond_table
        self.joining = AbsoluteEmbedding(d_model, combine, position_dims)
        self.table = nn.Embedding(self.max_positions, self.joining.width)
        nn.init.normal_(self.table.weight, std=0.02)

    def check_length(self, max_position: int) -> None:
        if max_position >= self.max_positions and self.beyond_table == "error":
            raise ConfigError(
                f"learned positions: position {max_position} is beyond the table of "
                f"{self.max_positions} rows; raise pos.max_positions (training) or allow it with "
                "pos.beyond_table=clamp (evaluation: +eval.pos_overrides.beyond_table=clamp)"
            )

    def embed(self, x: Tensor, positions: Tensor | Prepared) -> Tensor:
        positions = self.prepared(positions).positions
        if positions.numel():
            self.check_length(int(positions.max()))
        index = positions.clamp(max=self.max_positions - 1).to(torch.long)
        return self.joining.join(x, self.table(index))
