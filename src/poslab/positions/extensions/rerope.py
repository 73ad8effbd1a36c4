"""`rerope` (Su 2023): the relative position min(m − n, w) for a window w: inside the window plain
rotary; beyond it every key is seen at distance w. The default w = L puts those keys one past the
largest trained distance (L − 1); bojone/rerope uses w = L/8 … L/4. With `leaky: k` the distance
beyond the window grows as w + (m − n − w)/k. Two score matrices merged by the distance mask, as
bojone/rerope does (attention=blockwise)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, number, require
from poslab.positions.extensions.base import Extension


@dataclass(frozen=True)
class ReRoPE(Extension):
    window: int | None = None  # w (null: L)
    leaky: float | None = None  # beyond w the distance grows by 1/leaky per token

    uses_factor: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        require("eval.rope_scaling.window", self.window, integer(1, null=True))
        require("eval.rope_scaling.leaky", self.leaky, number(gt=1, null=True))

    def local_window(self) -> int:
        return self.window or self.train_length

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        if self.leaky is None:  # every key beyond the window is seen at distance w
            return window, torch.full_like(q_positions, window), None
        # relative position (m − n)/k + w(1 − 1/k) = w + (m − n − w)/k
        leak = self.leaky
        return window, q_positions / leak + window * (1 - 1 / leak), k_positions / leak

    def label_parts(self, shown_factor: str) -> list[str]:
        parts = [f"w={self.window}" if self.window else "w=L"]
        return parts + ([f"k={self.leaky:g}"] if self.leaky else [])
