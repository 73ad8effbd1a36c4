"""`lminfinite` (Han et al. 2024, LM-Infinite): a Λ-shaped mask, each query sees the first
`n_global` tokens of the window (10: Glaciohound/LM-Infinite's drop-in) and the keys closer than
`window` (null: L), and distances capped at L (keys L or more away are seen at distance L:
ReRoPE with w = L). Masked scores are −inf; the query's own key is always seen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, require
from poslab.positions.extensions.base import Extension


@dataclass(frozen=True)
class LMInfinite(Extension):
    n_global: int = 10  # the first tokens every query sees
    window: int | None = None  # the local branch (null: L)

    uses_factor: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        require("eval.rope_scaling.n_global", self.n_global, integer(0))
        require("eval.rope_scaling.window", self.window, integer(1, null=True))

    def local_window(self) -> int:
        return self.window or self.train_length

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        cap = self.train_length  # distances capped at L
        return cap, torch.full_like(q_positions, cap), None

    def seen(self, distance: Tensor, window: int) -> Tensor | None:
        index = torch.arange(distance.shape[-1], device=distance.device)
        return (distance < window) | (index < self.n_global)

    def label_parts(self, shown_factor: str) -> list[str]:
        return [f"g={self.n_global}", f"w={self.window}" if self.window else "w=L"]
