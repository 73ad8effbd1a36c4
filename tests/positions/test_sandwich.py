"""positions/sandwich.py: the bias against its formula."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.positions.sandwich import Sandwich

D_MODEL, N_HEAD = 32, 4


def test_sandwich_formula_and_shape():
    scheme = Sandwich(D_MODEL, N_HEAD, dim=8)
    bias = scheme.attention_bias(torch.tensor([5]), torch.tensor([5, 3]))[:, 0]
    for h in range(N_HEAD):
        total = sum(math.cos(2 * 10000 ** (-2 * k / 8)) for k in range(1, 5))
        assert bias[h, 1].item() == pytest.approx((total - 4) / (8 * (h + 1) / N_HEAD), rel=1e-5)
        assert bias[h, 0].item() == 0
    # never above its value at distance 0; fractional positions take the direct path
    row = scheme.attention_bias(torch.tensor([300]), torch.arange(301))
    assert row.max() <= 1e-6
    frac = scheme.attention_bias(torch.tensor([7.5]), torch.tensor([0.25, 3.0]))
    direct = scheme.score_bias(
        torch.arange(N_HEAD)[:, None, None],
        torch.tensor(7.5),
        torch.tensor([0.25, 3.0])[None, None, :],
    )
    torch.testing.assert_close(frac, direct)
