"""`string`, STRING (An et al., ICLR 2025, "Why Does the Effective Context Length of LLMs Fall
Short?"; HKUNLP/STRING): training leaves the largest relative positions rare, so it drops them
and shifts the well-trained ones over them. With a shift S (`shift`; null: ⌊0.33·L⌋, the
reference's default) and a local window W (`local`; null: 128 as the reference, at most S/2 for
short training lengths), the relative position m − n becomes

    m − n            where m − n < S   (plain rotary: the neighbours keep their positions)
    m − n − S + W    where m − n ≥ S   (the far keys, seen as if S − W closer)

as the paper writes it. The reference merges two flash-attention passes whose windows both hold
the key at distance exactly S (it is scored twice there); the formula above, followed here,
scores it once, shifted. Its cos/sin carry the reference's attention factor 0.1·ln 2 + 1
(`temperature: false` leaves them as trained). No factor: one model serves every length. Built
to use the trained positions well *within* L; past L the largest distance is still T − 1 − S + W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from poslab.checks import boolean, integer, require
from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension

REFERENCE_LOCAL = 128  # the reference's small_local_value
REFERENCE_SHARE = 0.33  # the reference's shifted_offset = int(0.33 · L)


@dataclass(frozen=True)
class String(Extension):
    shift: int | None = None  # S (null: int(0.33 · L))
    local: int | None = None  # W (null: min(128, S // 2))
    temperature: bool = True  # cos/sin times 0.1·ln 2 + 1, as the reference

    uses_factor: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        require("eval.rope_scaling.shift", self.shift, integer(1, null=True))
        require("eval.rope_scaling.local", self.local, integer(0, null=True))
        require("eval.rope_scaling.temperature", self.temperature, boolean())
        # S is known once given or once L is (options are first checked before L is read)
        known = self.shift is not None or self.train_length > 1
        if known and self.local_value > self.shift_value:
            rule = "" if self.shift else f" (int(0.33 · L) at L = {self.train_length})"
            raise ConfigError(
                f"eval.rope_scaling.local={self.local_value} must be at most shift="
                f"{self.shift_value}{rule}: the far keys are seen S − W closer (W ≤ S)"
            )

    @property
    def shift_value(self) -> int:
        return self.shift or max(1, int(REFERENCE_SHARE * self.train_length))

    @property
    def local_value(self) -> int:
        return self.local if self.local is not None else min(REFERENCE_LOCAL, self.shift_value // 2)

    def local_window(self) -> int:
        return self.shift_value

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        shift, local = self.shift_value, self.local_value
        return shift, q_positions - (shift - local), k_positions

    @property
    def attention_factor(self) -> float:
        return 0.1 * math.log(2) + 1 if self.temperature else 1.0

    def label_parts(self, shown_factor: str) -> list[str]:
        # null options by their rule: the label is made before L is known (rope_scaling.py)
        parts = [f"S={self.shift}" if self.shift else "S=L/3"]
        parts.append(f"W={self.local}" if self.local is not None else "W=min(128,S/2)")
        return parts + ([] if self.temperature else ["no-temp"])
