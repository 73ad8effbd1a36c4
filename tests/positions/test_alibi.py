"""positions/alibi.py: the slopes of the paper for every head count, the bias in fp32."""

from __future__ import annotations

import pytest
import torch

from poslab.positions.alibi import ALiBi, alibi_slopes


def _paper_slopes(n: int) -> list[float]:
    def geometric(m: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / m) for i in range(m)]

    p = 1
    while p * 2 <= n:
        p *= 2
    if p == n:
        return geometric(n)
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


def test_alibi_slopes_8_heads():
    assert alibi_slopes(8) == pytest.approx([1 / 2**k for k in range(1, 9)], rel=1e-12)


def test_alibi_slopes_6_heads_literal():
    assert alibi_slopes(6) == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])


@pytest.mark.parametrize("n_head", [6, 12, 20])
def test_alibi_slopes_non_power_of_two(n_head):
    slopes = alibi_slopes(n_head)
    assert len(slopes) == n_head
    assert slopes == pytest.approx(_paper_slopes(n_head), rel=1e-12)
    assert len(set(slopes)) == n_head  # every head gets its own slope


@pytest.mark.parametrize("n_head", [1, 2, 4, 16])
def test_alibi_slopes_power_of_two_geometric(n_head):
    slopes = alibi_slopes(n_head)
    start = 2.0 ** (-8.0 / n_head)
    assert slopes[0] == pytest.approx(start, rel=1e-12)
    assert slopes == pytest.approx([start ** (i + 1) for i in range(n_head)], rel=1e-12)
    assert slopes[-1] == pytest.approx(2.0**-8, rel=1e-12)


def test_alibi_attention_bias_values():
    scheme = ALiBi(32, 4)
    q_pos = torch.arange(5) + 10
    k_pos = torch.arange(7)
    bias = scheme.attention_bias(q_pos, k_pos)
    assert bias.shape == (4, 5, 7)
    assert bias.dtype == torch.float32
    slopes = _paper_slopes(4)
    expected = torch.tensor(
        [[[-slopes[h] * (float(q) - float(k)) for k in k_pos] for q in q_pos] for h in range(4)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(bias.double(), expected, rtol=1e-6, atol=1e-6)


def test_alibi_attention_bias_fp32_under_bf16_autocast():
    scheme = ALiBi(48, 6)
    slopes = torch.tensor(_paper_slopes(6), dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bias = scheme.attention_bias(torch.tensor([2501, 2496]), torch.tensor([0, 1]))
    assert bias.dtype == torch.float32
    assert bias.shape == (6, 2, 2)
    assert not torch.equal(bias[:, 0], bias[:, 1])
    torch.testing.assert_close(
        (bias[:, 0, 0] - bias[:, 1, 0]).double(), -5.0 * slopes, rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(bias[:, 0, 0].double(), -2501.0 * slopes, rtol=1e-6, atol=1e-6)
