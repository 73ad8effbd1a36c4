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


@pytest.mark.parametrize(
    ("q_range", "k_range"),
    [
        ((0, 64), (0, 64)),  # training: every row below the threshold (100)
        ((0, 300), (0, 300)),  # evaluation past it: the table for 100 rows, pairs for the rest
        ((64, 128), (0, 128)),  # a query block of the blockwise kernel
        ((150, 200), (0, 200)),  # a block wholly past the threshold
        ((7, 40), (7, 40)),  # an offset (eval.position_offset)
    ],
)
@pytest.mark.parametrize("per_layer", [False, True])
def test_distance_table_equals_the_pair_path(q_range, k_range, per_layer):
    """Rows below the threshold computed once per distance give the bias, and the gradients of
    c, L and the MLP, of the MLP run on every (query, key) pair."""
    torch.manual_seed(0)
    scheme = Fire(D_MODEL, N_HEAD, threshold_init=100.0, per_layer=per_layer, n_layer=2)
    q, k = torch.arange(*q_range).float(), torch.arange(*k_range).float()
    layer = 1 if per_layer else 0
    fast = scheme.attention_bias(q, k, layer)
    slow = scheme._bias_by_pair(q, k, layer)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(slow)
    grads = [
        torch.autograd.grad((b * weights).sum(), list(scheme.parameters()), allow_unused=True)
        for b in (scheme.attention_bias(q, k, layer), scheme._bias_by_pair(q, k, layer))
    ]
    for g_fast, g_slow in zip(*grads, strict=True):
        if g_slow is None:
            assert g_fast is None
        else:
            # fp32 sums over ~10⁵ pairs in another order: within 2e-5 of the largest entry
            # (against a float64 formula the table is the closer of the two)
            scale = float(g_slow.abs().max())
            torch.testing.assert_close(g_fast, g_slow, rtol=1e-4, atol=2e-5 * scale)


def test_positions_not_consecutive_take_the_pair_path():
    scheme = Fire(D_MODEL, N_HEAD, threshold_init=100.0)
    sparse = torch.tensor([0.0, 3.0, 4.0, 9.0])  # randomized positions (pos.randomize_max)
    assert scheme._rows_by_distance(sparse, sparse, 0) == 0
    batched = torch.arange(8).float().expand(2, 8)  # per-sequence positions
    assert scheme._rows_by_distance(batched, batched, 0) == 0
    assert scheme._rows_by_distance(torch.arange(8).float(), torch.arange(8).float(), 0) == 8
