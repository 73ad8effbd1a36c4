"""positions/fire.py: the normalised distance, m − n below the threshold, a bounded bias."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.positions.fire import Fire

D_MODEL, N_HEAD = 32, 4


def test_fire_input_is_normalised_and_relative_below_the_threshold():
    torch.manual_seed(0)
    scheme = Fire(D_MODEL, N_HEAD, threshold_init=100.0, c_init=0.1)
    q = torch.arange(0, 400, 7).float()[:, None]
    k = torch.arange(0, 400, 5).float()[None, :]
    x = scheme.normalized_distance(q, k, 0)
    causal = k <= q
    assert x[causal].min() >= 0 and x[causal].max() <= 1 + 1e-6
    # the formula on one pair: psi(m - n) / psi(max(L, m)), psi(x) = log(1 + c x)
    value = scheme.normalized_distance(torch.tensor(250.0), torch.tensor(40.0), 0)
    assert value.item() == pytest.approx(math.log1p(0.1 * 210) / math.log1p(0.1 * 250), rel=1e-6)
    below = scheme.attention_bias(torch.tensor([60, 90]), torch.tensor([10, 40]))
    shifted = scheme.attention_bias(torch.tensor([60, 90]) - 5, torch.tensor([10, 40]) - 5)
    torch.testing.assert_close(below, shifted)  # m ≤ L: m − n alone
    # bounded: at any length the bias stays within what f takes on [0, 1]
    far = scheme.attention_bias(torch.tensor([100_000]), torch.arange(0, 100_001, 997))
    grid = scheme.mlp(torch.linspace(0, 1, 2001), 0).t()
    assert far.min() >= grid.min() - 1e-4 and far.max() <= grid.max() + 1e-4
    # score_bias (flex's score_mod) and the chunked attention_bias agree
    heads = torch.arange(N_HEAD)[:, None, None]
    qp, kp = torch.tensor([60.0, 90.0])[None, :, None], torch.tensor([10.0, 40.0])[None, None, :]
    torch.testing.assert_close(scheme.score_bias(heads, qp, kp), below)
