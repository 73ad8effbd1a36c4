"""positions/xpos.py: ζ carried to the distance; fp16 refused where the scales overflow."""

from __future__ import annotations

import pytest
import torch

from poslab.errors import ConfigError
from poslab.positions.xpos import XPos

D_MODEL, N_HEAD = 32, 4


def test_xpos_scores_carry_zeta_to_the_distance():
    scheme = XPos(8, 1, scale_base=4.0, base=10000.0)
    zeta = (torch.arange(0, 8, 2) / 8 + 0.4) / 1.4
    torch.testing.assert_close(scheme.zeta, zeta)
    q = torch.randn(1, 1, 1, 8).expand(1, 1, 20, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 1, 20, 8)
    for offset in (0, 1000):
        rq, rk = scheme.rotate(q, k, torch.arange(20) + offset)
        scores = rq[0, 0] @ rk[0, 0].T
        if offset == 0:
            reference = scores
        torch.testing.assert_close(scores, reference, atol=1e-4, rtol=1e-4)
    # per pair the decay is exactly zeta_i^((m - n)/gamma): rotation off (a base so large that
    # every angle is ~0 is not possible, so compare with plain rotary)
    rope = XPos(8, 1, scale_base=1e12)  # decay ~1: plain rotary
    rq, rk = scheme.rotate(q, k, torch.arange(20))
    pq, pk = rope.rotate(q, k, torch.arange(20))
    m, n = 12, 4
    pair_scores = (rq[0, 0, m] * rk[0, 0, n]).view(4, 2).sum(-1)
    plain = (pq[0, 0, m] * pk[0, 0, n]).view(4, 2).sum(-1)
    torch.testing.assert_close(pair_scores, plain * zeta ** ((m - n) / 4.0), atol=1e-5, rtol=1e-4)


def test_xpos_refuses_fp16_where_its_scales_would_overflow():
    scheme = XPos(D_MODEL, N_HEAD)
    q = torch.randn(1, N_HEAD, 8192, D_MODEL // N_HEAD).half()
    with pytest.raises(ConfigError, match="beyond what fp16 holds"):
        scheme.rotate(q, q, torch.arange(8192))
    short = q[:, :, :512]
    assert torch.isfinite(scheme.rotate(short, short, torch.arange(512))[0]).all()
