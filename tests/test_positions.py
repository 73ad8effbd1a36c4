"""Properties of the positional schemes, each checked against an independent reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.positions.alibi import ALiBi, alibi_slopes
from poslab.positions.learned import LearnedPositions
from poslab.positions.rope import Rotary, rope_theta, rotate
from poslab.positions.sinusoidal import SinusoidalPositions, sinusoidal_table
from poslab.positions.t5 import T5Bias, t5_bucket

PAIRINGS = ("interleaved", "half")


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def _reference_rotation(x: torch.Tensor, positions, theta, pairing: str) -> torch.Tensor:
    """Rotate the pairs of x (T, R) in float64 with explicit 2x2 rotation matrices."""
    x = x.double()
    out = x.clone()
    n_rot = x.shape[-1]
    for t, m in enumerate(positions):
        for i, th in enumerate(theta):
            a_idx, b_idx = (2 * i, 2 * i + 1) if pairing == "interleaved" else (i, i + n_rot // 2)
            angle = float(m) * float(th)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[t, a_idx].item(), x[t, b_idx].item()
            out[t, a_idx] = a * c - b * s
            out[t, b_idx] = a * s + b * c
    return out


def _score(rot: Rotary, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """q·k of q rotated at position m and k rotated at position n; q, k: (head_dim,)."""
    q4, k4 = q.view(1, 1, 1, -1), k.view(1, 1, 1, -1)
    q_m, _ = rot.rotate(q4, q4, torch.tensor([m]))
    _, k_n = rot.rotate(k4, k4, torch.tensor([n]))
    return (q_m * k_n).sum()


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_matches_explicit_rotation_matrices(pairing):
    torch.manual_seed(0)
    rot = Rotary(32, 2, pairing=pairing)  # head_dim 16
    positions = [0, 1, 5, 37, 300]
    q = torch.randn(1, 1, len(positions), 16)
    q_rot, _ = rot.rotate(q, q, torch.tensor(positions))
    ref = _reference_rotation(q[0, 0], positions, rot.theta.tolist(), pairing)
    torch.testing.assert_close(q_rot[0, 0].double(), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_preserves_norms(pairing):
    torch.manual_seed(0)
    rot = Rotary(64, 4, pairing=pairing)
    q = torch.randn(2, 4, 9, 16)
    k = torch.randn(2, 4, 9, 16)
    positions = torch.arange(9) * 37 + 3
    q_rot, k_rot = rot.rotate(q, k, positions)
    assert not torch.allclose(q_rot, q)  # it did rotate
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot.norm(dim=-1), k.norm(dim=-1), atol=1e-5, rtol=1e-5)
    # the bare `rotate` function, with arbitrary angles, is a rotation too
    angles = torch.rand(9, 8) * 100
    x = torch.randn(3, 9, 16)
    torch.testing.assert_close(
        rotate(x, angles, pairing).norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_score_depends_only_on_relative_position(pairing, fraction):
    torch.manual_seed(1)
    rot = Rotary(32, 2, pairing=pairing, fraction=fraction)
    q, k = torch.randn(16), torch.randn(16)
    scores_by_diff = {}
    for diff in (0, 1, 3, 7):
        scores = [_score(rot, q, k, n + diff, n) for n in (0, 4, 61, 250)]
        for s in scores[1:]:
            torch.testing.assert_close(s, scores[0], atol=1e-4, rtol=1e-5)
        scores_by_diff[diff] = scores[0].item()
    values = list(scores_by_diff.values())
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            assert abs(values[i] - values[j]) > 1e-3, scores_by_diff
    # and the relative score is not symmetric in general: m - n = +3 differs from -3
    assert abs(_score(rot, q, k, 10, 7).item() - _score(rot, q, k, 7, 10).item()) > 1e-3


def test_rope_half_and_interleaved_equivalent_up_to_permutation():
    torch.manual_seed(2)
    head_dim = 16
    half, inter = Rotary(32, 2, pairing="half"), Rotary(32, 2, pairing="interleaved")
    # interleaved dims (2i, 2i+1) <- half dims (i, i + R/2)
    perm = torch.tensor([d for i in range(head_dim // 2) for d in (i, i + head_dim // 2)])
    q_half = torch.randn(2, 2, 11, head_dim)
    k_half = torch.randn(2, 2, 11, head_dim)
    q_inter, k_inter = q_half[..., perm], k_half[..., perm]
    positions = torch.arange(11) * 13
    qh, kh = half.rotate(q_half, k_half, positions)
    qi, ki = inter.rotate(q_inter, k_inter, positions)
    torch.testing.assert_close(qi, qh[..., perm], atol=1e-6, rtol=1e-6)
    scores_half = qh @ kh.transpose(-1, -2)
    scores_inter = qi @ ki.transpose(-1, -2)
    torch.testing.assert_close(scores_inter, scores_half, atol=1e-5, rtol=1e-5)
    # without the permutation the two pairings are genuinely different
    qi_wrong, ki_wrong = inter.rotate(q_half, k_half, positions)
    assert not torch.allclose(qi_wrong @ ki_wrong.transpose(-1, -2), scores_half, atol=1e-3)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_fraction_leaves_other_dims_bit_identical(pairing):
    torch.manual_seed(3)
    rot = Rotary(64, 4, pairing=pairing, fraction=0.5)  # head_dim 16, 8 rotated
    assert rot.rotary_dims == 8
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    q_rot, k_rot = rot.rotate(q, k, torch.arange(7) + 100)
    assert torch.equal(q_rot[..., 8:], q[..., 8:])
    assert torch.equal(k_rot[..., 8:], k[..., 8:])
    assert not torch.allclose(q_rot[..., :8], q[..., :8])
    assert not torch.allclose(k_rot[..., :8], k[..., :8])


@pytest.mark.parametrize(
    ("d_model", "n_head", "fraction", "base"),
    [(32, 2, 1.0, 10000.0), (64, 4, 0.5, 10000.0), (48, 2, 1.0, 500.0), (64, 1, 0.25, 1e6)],
)
def test_rope_theta_closed_form(d_model, n_head, fraction, base):
    rot = Rotary(d_model, n_head, base=base, fraction=fraction)
    n_rot = round(d_model // n_head * fraction)
    expected = torch.tensor(
        [base ** (-2 * i / n_rot) for i in range(n_rot // 2)], dtype=torch.float64
    )
    assert rot.theta.shape == (n_rot // 2,)
    assert rot.theta.dtype == torch.float32
    torch.testing.assert_close(rot.theta.double(), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(rope_theta(n_rot, base).double(), expected, rtol=1e-6, atol=0)


def test_rope_learnable_theta_is_parameter_with_gradient():
    torch.manual_seed(4)
    rot = Rotary(32, 4, learnable_theta=True)
    params = dict(rot.named_parameters())
    assert "theta" in params and isinstance(rot.theta, nn.Parameter)
    assert rot.theta.requires_grad
    assert "theta_init" not in params  # the reference value is not trained
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    q_rot, k_rot = rot.rotate(q, k, torch.arange(1, 7))
    loss = (q_rot @ k_rot.transpose(-1, -2)).square().mean()
    loss.backward()
    assert rot.theta.grad is not None
    assert torch.isfinite(rot.theta.grad).all()
    assert rot.theta.grad.abs().sum() > 0


def test_rope_fixed_theta_is_buffer():
    rot = Rotary(32, 4, learnable_theta=False)
    assert "theta" in dict(rot.named_buffers())
    assert all(p is not rot.theta for p in rot.parameters())
    assert len(list(rot.parameters())) == 0
    assert not rot.theta.requires_grad
    assert "theta" not in rot.state_dict()  # derived state: rebuilt from pos.base, not saved


def test_rope_metrics_report_theta_movement():
    rot = Rotary(32, 4, learnable_theta=True)
    before = rot.metrics()
    assert before, "learnable theta must report metrics"
    for value in before.values():
        assert float(value) == 0.0
    with torch.no_grad():
        rot.theta.mul_(1.1)
        rot.theta[0] *= 2.0  # the first frequency moves further
    after = rot.metrics()
    assert set(after) == set(before)
    assert all(float(v) > 0 for v in after.values())
    assert float(after["theta_rel_change_max"]) == pytest.approx(1.2, rel=1e-5)
    n = rot.theta.numel()
    assert float(after["theta_rel_change_mean"]) == pytest.approx(
        (1.2 + 0.1 * (n - 1)) / n, rel=1e-5
    )


def test_rope_odd_rotated_dims_raise_config_error():
    # head_dim = 24 / 4 = 6, fraction 0.5 -> 3 rotated dims: cannot be paired
    with pytest.raises(ConfigError, match=r"pos\.fraction"):
        Rotary(24, 4, fraction=0.5)
    Rotary(24, 4, fraction=1.0)  # 6 dims are fine


def test_rope_angles_fp32_under_bf16_autocast():
    # precondition that makes the test meaningful: bf16 collides these positions
    assert torch.tensor(2501.0).bfloat16() == torch.tensor(2496.0).bfloat16()
    rot = Rotary(32, 4)
    positions = torch.tensor([2501, 2496])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        angles = rot.angles(positions)
    assert angles.dtype == torch.float32
    assert not torch.equal(angles[0], angles[1])
    expected = torch.tensor([2501.0, 2496.0], dtype=torch.float64)[:, None] * rot.theta.double()
    torch.testing.assert_close(angles.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_bf16_rotate_equals_fp32_rotate_cast(pairing, fraction):
    torch.manual_seed(5)
    rot = Rotary(64, 4, pairing=pairing, fraction=fraction)
    q = torch.randn(2, 4, 5, 16).bfloat16()
    k = torch.randn(2, 4, 5, 16).bfloat16()
    positions = torch.tensor([2496, 2501, 2502, 2503, 7000])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q_bf, k_bf = rot.rotate(q, k, positions)
    q_fp, k_fp = rot.rotate(q.float(), k.float(), positions)  # pure fp32, no autocast
    assert q_bf.dtype == torch.bfloat16 and k_bf.dtype == torch.bfloat16
    assert torch.equal(q_bf, q_fp.bfloat16())
    assert torch.equal(k_bf, k_fp.bfloat16())
    # rows at 2496 and 2501 (same input vector) rotate differently
    q_same = q[:, :, :1].expand(2, 4, 2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q_pair, _ = rot.rotate(q_same, q_same, positions[:2])
    assert not torch.equal(q_pair[:, :, 0], q_pair[:, :, 1])


# --------------------------------------------------------------------------------------------
# Sinusoidal
# --------------------------------------------------------------------------------------------


def _sinusoidal_reference(positions, d_model: int, base: float = 10000.0) -> torch.Tensor:
    rows = []
    for p in positions:
        row = []
        for j in range(d_model):
            i = j // 2
            angle = p / base ** (2 * i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_table_closed_form(d_model):
    positions = list(range(200)) + [257, 513]
    table = sinusoidal_table(torch.tensor(positions), d_model)
    assert table.shape == (len(positions), d_model)
    assert table.dtype == torch.float32
    ref = _sinusoidal_reference(positions, d_model)
    torch.testing.assert_close(table.double(), ref, atol=1e-5, rtol=0)


def test_sinusoidal_table_custom_base():
    positions = list(range(50))
    table = sinusoidal_table(torch.tensor(positions), 12, base=100.0)
    torch.testing.assert_close(
        table.double(), _sinusoidal_reference(positions, 12, base=100.0), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(("scale", "expected_scale"), [(None, 1 / math.sqrt(24)), (2.5, 2.5)])
def test_sinusoidal_embed_adds_scaled_table(scale, expected_scale):
    torch.manual_seed(6)
    scheme = SinusoidalPositions(24, 4, scale=scale)
    x = torch.randn(2, 6, 24)
    positions = list(range(3, 9))
    out = scheme.embed(x, torch.tensor(positions))
    expected = x.double() + expected_scale * _sinusoidal_reference(positions, 24)[None]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# T5
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 500)])
def test_t5_bucket_properties(num_buckets, max_distance):
    distance = torch.arange(0, 1001)
    buckets = t5_bucket(distance, num_buckets, max_distance)
    assert buckets.dtype == torch.long
    assert buckets.shape == distance.shape
    assert (buckets[1:] >= buckets[:-1]).all(), "bucket must be monotone in distance"
    exact = num_buckets // 2
    assert torch.equal(buckets[:exact], distance[:exact])
    assert buckets.min() >= 0
    assert buckets.max() <= num_buckets - 1
    assert (buckets[max_distance:] == num_buckets - 1).all()
    # the logarithmic range actually uses several buckets between exact and the last one
    assert len(set(buckets[exact:max_distance].tolist())) > 2
    # future keys (negative distance) all map to bucket 0
    assert (t5_bucket(-torch.arange(1, 300), num_buckets, max_distance) == 0).all()


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 500)])
def test_t5_bucket_matches_reference_formula(num_buckets, max_distance):
    # the unidirectional bucketing of the T5 reference implementation, in float64
    def reference(d: int) -> int:
        d = max(d, 0)
        max_exact = num_buckets // 2
        if d < max_exact:
            return d
        ratio = math.log(d / max_exact) / math.log(max_distance / max_exact)
        return min(max_exact + int(ratio * (num_buckets - max_exact)), num_buckets - 1)

    distances = list(range(-5, 1001))
    buckets = t5_bucket(torch.tensor(distances), num_buckets, max_distance)
    assert buckets.tolist() == [reference(d) for d in distances]


@pytest.mark.parametrize("max_distance", [16, 8])
def test_t5_max_distance_within_exact_buckets_is_rejected(max_distance):
    # log(max_distance / (num_buckets/2)) <= 0 would give NaN or decreasing bucket indices
    with pytest.raises(ConfigError, match="max_distance"):
        T5Bias(32, 4, num_buckets=32, max_distance=max_distance)


def test_t5_attention_bias_is_function_of_relative_position():
    torch.manual_seed(7)
    scheme = T5Bias(32, 4)
    nn.init.normal_(scheme.bias)
    q_pos = torch.arange(6) + 3
    k_pos = torch.arange(9)
    bias = scheme.attention_bias(q_pos, k_pos)
    assert bias.shape == (4, 6, 9)
    assert bias.dtype == torch.float32
    by_distance: dict[int, torch.Tensor] = {}
    for i, q in enumerate(q_pos.tolist()):
        for j, k in enumerate(k_pos.tolist()):
            d = q - k
            if d in by_distance:
                assert torch.equal(bias[:, i, j], by_distance[d])
            else:
                by_distance[d] = bias[:, i, j]
    # distinct small distances really get distinct biases
    assert not torch.equal(by_distance[0], by_distance[1])
    # shifting both positions leaves the bias unchanged
    shifted = scheme.attention_bias(q_pos + 1000, k_pos + 1000)
    assert torch.equal(shifted, bias)
    # and it is the table entry of that distance's bucket
    for d, value in by_distance.items():
        bucket = int(t5_bucket(torch.tensor(d)))
        assert torch.equal(value, scheme.bias[0][bucket].detach())


# --------------------------------------------------------------------------------------------
# Learned
# --------------------------------------------------------------------------------------------


def test_learned_beyond_table_error():
    scheme = LearnedPositions(16, 2, max_positions=8)
    x = torch.zeros(1, 9, 16)
    out = scheme.embed(x[:, :8], torch.arange(8))  # the whole table is fine
    assert torch.equal(out[0], scheme.table.weight.detach())
    with pytest.raises(ConfigError, match=r"pos\.max_positions"):
        scheme.embed(x, torch.arange(9))
    with pytest.raises(ConfigError, match=r"pos\.max_positions"):
        scheme.embed(x[:, :1], torch.tensor([100]))


def test_learned_beyond_table_clamp_reuses_last_row():
    torch.manual_seed(8)
    scheme = LearnedPositions(16, 2, max_positions=8, beyond_table="clamp")
    x = torch.randn(2, 5, 16)
    out = scheme.embed(x, torch.tensor([2, 7, 8, 20, 1000]))
    table = scheme.table.weight.detach()
    torch.testing.assert_close(out[:, 0], x[:, 0] + table[2])
    for t in (1, 2, 3, 4):
        torch.testing.assert_close(out[:, t], x[:, t] + table[7])


def test_learned_bad_beyond_table_value():
    with pytest.raises(ConfigError, match="beyond_table"):
        LearnedPositions(16, 2, max_positions=8, beyond_table="wrap")


def test_rope_compiled_real_form_equals_the_complex_form():
    """Under torch.compile the interleaved rotation runs in real arithmetic (inductor has no
    complex codegen); both forms are the same rotation."""
    from poslab.positions import rope as rope_module

    torch.manual_seed(3)
    x = torch.randn(2, 3, 9, 8)
    angles = torch.arange(9.0)[:, None] * rope_module.rope_theta(8, 100.0)[None, :]
    eager = rope_module.rotate(x, angles, "interleaved")
    compiled = torch.compile(rope_module.rotate, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, angles, "interleaved"), eager, atol=1e-6, rtol=0)
    assert not torch.allclose(eager, x)
