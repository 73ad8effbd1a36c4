"""NoPE: no positional information at all; causal masking is the model's only cue to order."""

from __future__ import annotations

from typing import ClassVar

from poslab.positions.base import PositionalScheme


class NoPositions(PositionalScheme):
    """All hooks are the identity (inherited from the base class)."""

    reads_positions: ClassVar[bool] = False
    shift_invariant: ClassVar[bool] = True  # positions are not read at all
