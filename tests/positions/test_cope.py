"""positions/cope.py: contextual positions and the interpolation of their embeddings."""

from __future__ import annotations

import pytest
import torch

from poslab.positions.cope import CoPE

D_MODEL, N_HEAD = 32, 4


def test_cope_positions_and_interpolation():
    scheme = CoPE(8, 2, npos=8)
    scores = torch.randn(1, 2, 6, 6)
    future = torch.arange(6)[None, :] > torch.arange(6)[:, None]
    pos = scheme.positions_from_scores(scores, future)
    distance = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).expand_as(pos)
    past, later = (~future).expand_as(pos), future.expand_as(pos)
    # non-decreasing as n moves back, within (0, m − n + 1], zero for future keys
    step_back = pos[..., :-1] - pos[..., 1:]
    assert torch.all(step_back[past[..., 1:]] >= -1e-6)
    assert torch.all(pos[past] > 0) and torch.all(pos[past] <= distance[past] + 1)
    assert torch.all(pos[later] == 0)
    # hand-computed: q·e[p] interpolated between floor and ceil
    with torch.no_grad():
        scheme.pos_emb.copy_(torch.arange(8 * 4).view(8, 4).float())
    q = torch.ones(1, 1, 1, 4)
    one = torch.tensor([[[[0.0]]]])  # sigmoid(0) = 0.5 -> p = 0.5 for the only key
    zero = torch.zeros(1)
    out = scheme.modify_scores(one, q, q, torch.zeros(1, 1, dtype=torch.bool), zero, zero)
    e0, e1 = scheme.pos_emb[0].sum(), scheme.pos_emb[1].sum()
    assert out.item() == pytest.approx(0.5 * e0.item() + 0.5 * e1.item())
