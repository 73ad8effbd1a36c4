"""NoPE: no positional information at all; causal masking is the model's only cue to order.

A NoPE child of a rotary run (`python train.py extend=RUN pos=nope`, DroPE: poslab/run/extend.py)
carries the record of what it dropped in its `drope` option; the scheme computes the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from poslab.errors import ConfigError
from poslab.positions.base import PositionalScheme

# what extend= writes into a DroPE child's pos.drope
DROPE_KEYS = ("scheme", "train_length", "options")
DROPE_CHILD = "nope"  # the pos= of a DroPE child (extend=RUN pos=nope), as conf/pos/ names it


class NoPositions(PositionalScheme):
    """All hooks are the identity (inherited from the base class). `drope`: None, or for a
    child of extend=RUN pos=nope the scheme it dropped (`scheme`, its `options`) and the parent's
    training length (`train_length`): a record, for tables and compare.py."""

    reads_positions: ClassVar[bool] = False
    shift_invariant: ClassVar[bool] = True  # positions are not read at all

    def __init__(
        self, d_model: int, n_head: int, drope: Mapping[str, Any] | None = None, **common: Any
    ) -> None:
        super().__init__(d_model, n_head, **common)
        if drope is not None and (
            not isinstance(drope, Mapping) or any(k not in drope for k in DROPE_KEYS)
        ):
            raise ConfigError(
                f"pos.drope={drope!r} is not the record extend=RUN pos=nope writes "
                f"({', '.join(DROPE_KEYS)}); it is not set by hand"
            )
        self.drope = None if drope is None else dict(drope)
