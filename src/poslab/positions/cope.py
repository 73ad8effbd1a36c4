"""CoPE (Golovneva et al. 2024, "Contextual Position Encoding"): positions counted by the
content. Each query m gates every earlier key j with g_mj = σ(q_m·k_j); the position of key n
seen from m is the number of gated keys between them,

    p_mn = Σ_{j=n..m} g_mj        (fractional; non-decreasing as n moves back; ≤ m − n + 1),

and a learned vector e[p] per integer position (shared by the heads; `npos` of them, positions
beyond clamped to the last) is interpolated at p_mn and added to the score: q_m·e[p_mn],
computed as z_m[k] = q_m·e[k] for integer k, then interpolated linearly. Reference:
lucidrains/x-transformers `CoPE`. The gates use the scaled scores q·k/√d and only keys j ≤ m.

CoPE needs the queries and the scores, so it runs with attention=blockwise.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import integer, require
from poslab.positions.base import PositionalScheme


class CoPE(PositionalScheme):
    needs = "scores"
    reads_positions = False  # positions come from the content, not from the token index
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, npos: int = 64, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.npos", npos, integer(2))
        self.npos = npos
        self.pos_emb = nn.Parameter(torch.zeros(npos, self.head_dim))

    def positions_from_scores(self, scores: Tensor, future: Tensor) -> Tensor:
        """p_mn = Σ_{j=n..m} σ(score_mj) over the keys j ≤ m (future keys gate nothing)."""
        gates = torch.sigmoid(scores).masked_fill(future, 0.0)
        return gates.flip(-1).cumsum(-1).flip(-1)

    def modify_scores(
        self,
        scores: Tensor,
        q: Tensor,
        k: Tensor,
        future: Tensor,
        q_positions: Tensor,
        k_positions: Tensor,
        layer: int = 0,
    ) -> Tensor:
        pos = self.positions_from_scores(scores, future).clamp(max=self.npos - 1)
        logits = q.float() @ self.pos_emb.float().t()  # (B, H, Tq, npos): q·e[k]
        # z[p] = z[⌊p⌋] + (p − ⌊p⌋)·(z[⌊p⌋ + 1] − z[⌊p⌋]): the step to the next position is
        # gathered from a table of npos differences (the last one 0: p ≤ npos − 1), so each
        # (query, key) pair costs one floor and two gathers, not a floor, a ceil and two gathers
        steps = torch.nn.functional.pad(logits.diff(dim=-1), (0, 1))
        floor = pos.floor()
        index = floor.long()
        low = logits.gather(-1, index)
        return scores + low + (pos - floor) * steps.gather(-1, index)
