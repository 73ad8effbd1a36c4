"""positions/rope.py: the rotation against explicit rotation matrices, the two pairings, θ,
bf16 autocast, the compiled form."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.positions.rope import Rotary, rope_theta, rotate

PAIRINGS = ("interleaved", "half")


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
