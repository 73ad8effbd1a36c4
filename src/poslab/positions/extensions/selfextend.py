"""`selfextend` (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend"): keys closer than the
neighbour window w (`window`; null: L/4) get plain rotary attention; farther keys grouped
attention, the query at ⌊m/G⌋ + w − ⌊w/G⌋ and the key at ⌊n/G⌋ for the group size G (`group`,
4), so the largest distance at T tokens is about (T − w)/G + w. m and n count from the window's
first position, so `eval.position_offset` changes nothing. Merged by distance as ReRoPE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, require
from poslab.positions.extensions.base import Extension


@dataclass(frozen=True)
class SelfExtend(Extension):
    group: int = 4  # G: grouped positions ⌊m/G⌋
    window: int | None = None  # the neighbour window (null: L/4)

    uses_factor: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        require("eval.rope_scaling.group", self.group, integer(1))
        require("eval.rope_scaling.window", self.window, integer(1, null=True))

    def local_window(self) -> int:
        return self.window or max(1, self.train_length // 4)

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        origin = k_positions.amin(dim=-1, keepdim=True)  # keys start at the window's first
        group = self.group
        far_q = torch.floor((q_positions - origin) / group) + (window - window // group)
        return window, far_q, torch.floor((k_positions - origin) / group)

    def label_parts(self, shown_factor: str) -> list[str]:
        return [f"G={self.group}", f"w={self.window}" if self.window else "w=L/4"]
