"""`dpe`, DPE (Lu et al. 2025, arXiv 2504.18857, "Effective Length Extrapolation via
Dimension-Wise Positional Embeddings Manipulation"; LuLuLuyi/DPE): Self-Extend with a group size
per band of frequencies. The rotary pairs split into len(`groups`) equal bands, the fastest
first; keys closer than the window w (`window`; null: L/4) get plain rotary attention, and
farther keys, in band b, the query at ⌊m/G_b⌋ + w − w/G_b over the key at ⌊n/G_b⌋ (the
reference's `query_position // i + w − w / i`, its w/G_b not rounded). A band with G = 1 keeps
its positions; a large G squeezes far distances into the range training saw.

The paper finds each band's G by a needle-in-a-haystack search per band and then restricts the
change to the top-k dimensions by attention contribution (its `select_topk_dim`, off in its
quick start); poslab takes G as given: the default is the list the reference publishes for
Llama-3-8B-Instruct ([4, 4, 2, 16, 32, 32, 16, 128] over 8 bands), and neither the search nor
the top-k selection is built. No factor: one model serves every length. m and n count from the
window's first position, so `eval.position_offset` changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import integer, list_of, require
from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension

REFERENCE_GROUPS = (4, 4, 2, 16, 32, 32, 16, 128)  # the reference's Llama-3-8B-Instruct list


@dataclass(frozen=True)
class DPE(Extension):
    groups: tuple[int, ...] = REFERENCE_GROUPS  # G per band of pairs, the fastest band first
    window: int | None = None  # the neighbour window (null: L/4)

    uses_factor: ClassVar[bool] = False
    needs_scores: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        require("eval.rope_scaling.groups", self.groups, list_of(integer(1)))
        require("eval.rope_scaling.window", self.window, integer(1, null=True))
        object.__setattr__(self, "groups", tuple(int(g) for g in self.groups))

    def check_dims(self, rotary_dims: int) -> None:
        pairs, bands = rotary_dims // 2, len(self.groups)
        if pairs % bands:
            raise ConfigError(
                f"eval.rope_scaling.groups has {bands} group sizes, but this model's "
                f"{pairs} rotary pairs (R = {rotary_dims}) do not split into {bands} equal "
                f"bands; give a number of sizes that divides {pairs}"
            )

    def local_window(self) -> int:
        return self.window or max(1, self.train_length // 4)

    def far_positions(
        self, q_positions: Tensor, k_positions: Tensor, window: int
    ) -> tuple[int, Tensor, Tensor | None]:
        """Far positions per band: (…, T, bands), which Rotary spreads over each band's pairs."""
        origin = k_positions.amin(dim=-1, keepdim=True)  # keys start at the window's first
        group = torch.tensor(self.groups, dtype=torch.float32, device=q_positions.device)
        q = (q_positions - origin)[..., None]
        k = (k_positions - origin)[..., None]
        return window, torch.floor(q / group) + window - window / group, torch.floor(k / group)

    def label_parts(self, shown_factor: str) -> list[str]:
        groups = "Llama-3" if self.groups == REFERENCE_GROUPS else "/".join(map(str, self.groups))
        return [f"G={groups}", f"w={self.window}" if self.window else "w=L/4"]
