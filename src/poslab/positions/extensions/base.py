"""The interface of an eval-time RoPE context extension (`eval.rope_scaling.kind=NAME`).

A kind is one module in this folder and one file conf/extension/NAME.yaml (its class and option
defaults). It says what it changes, and poslab's Rotary (positions/rope.py) and the pretrained
models' rotary modules (pretrained.py) ask it, never its name:

* the frequencies θ'_i (`theta`), the positions (`position_scale`, PI's 1/s) and a factor on
  cos/sin (`attention_factor`, YaRN's temperature) — frequency kinds;
* or, for kinds that merge two score matrices by distance (`needs_scores`), where the far keys
  and queries are placed (`far_positions`) and which keys are seen (`seen`).

`factor` is s (1 where the kind ignores it: `uses_factor` False), `train_length` L. log-n is
not a kind: it combines with any (rope_scaling.RopeScaling holds it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from torch import Tensor

from poslab.checks import integer, number, require


@dataclass(frozen=True)
class Extension:
    factor: float = 1.0  # s
    train_length: int = 1  # L: the length the model was trained at

    named: ClassVar[bool] = True  # False (none): no name in the tables' labels
    uses_factor: ClassVar[bool] = True  # False: one model serves every evaluation length
    auto_is_one: ClassVar[bool] = False  # factor `auto` means s = 1 (it reads the length itself)
    reads_length: ClassVar[bool] = False  # its frequencies follow the evaluated span
    needs_scores: ClassVar[bool] = False  # merges two score matrices (attention=blockwise)
    identity_at_one: ClassVar[bool] = True  # s = 1 computes exactly the trained model

    def __post_init__(self) -> None:
        require("eval.rope_scaling.factor", self.factor, number(ge=1))
        require("eval.rope_scaling.train_length", self.train_length, integer(1))
        self.check()

    def check(self) -> None:
        """The kind's own options, each a ConfigError naming it (called on construction)."""

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The options of eval.rope_scaling this kind reads (besides kind, factor, logn)."""
        return tuple(f.name for f in fields(cls) if f.name not in ("factor", "train_length"))

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.option_names()}

    def resolved_options(self) -> dict[str, Any]:
        """Options to record in a model's config in place of the ones given (longrope: the
        lists its factors_file held, so that a checkpoint never needs the file); {}: as given."""
        return {}

    # -- frequency kinds -----------------------------------------------------------------------

    @property
    def rescales_theta(self) -> bool:
        """Whether `theta` changes the frequencies: a kind that defines it, unless it is the
        identity here (s = 1 for ntk, yarn, llama3 changes nothing, bit for bit)."""
        return type(self).theta is not Extension.theta and not self.is_identity()

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        """θ'_i (fp32) for a forward over `length` positions; `base` is the scheme's pos.base.
        Asked only where `rescales_theta` (RopeScaling.theta)."""
        return theta

    @property
    def position_scale(self) -> float:
        return 1.0

    @property
    def attention_factor(self) -> float:
        return 1.0

    def check_dims(self, rotary_dims: int) -> None:
        """What needs the model's rotated dims R (longrope: R/2 factors per list)."""

    def is_identity(self) -> bool:
        """Whether it computes exactly what no extension does."""
        return self.identity_at_one and self.factor == 1

    # -- score kinds ---------------------------------------------------------------------------

    def local_window(self) -> int:
        """Keys closer than this get plain rotary attention."""
        return self.train_length

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        """(cap, far query positions, far key positions or None for 0): keys at distance ≥ cap
        are scored with the query and key turned to these positions."""
        raise NotImplementedError(f"{type(self).__name__} does not merge score matrices")

    def seen(self, distance: Tensor, window: int) -> Tensor | None:
        """Which keys a query sees (None: all of the causal past)."""
        return None

    # -- tables --------------------------------------------------------------------------------

    def label_parts(self, shown_factor: str) -> list[str]:
        """The table name's parts after the kind's name: `s=4`, `w=L`, …"""
        return [f"s={shown_factor}"] if self.uses_factor else []
