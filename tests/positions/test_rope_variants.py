"""positions/p_rope.py, hope.py, resonance.py, ssmax.py: the rotary variants researchers compare
against. θ against Hugging Face's "proportional" rope (p_rope) and against the papers' formulas
in float64 (hope, resonance), Resonance's exact periods, SSMax's scores against a float64
reference, its per-head trainable s, fp32 positions under bf16 autocast, the one-line option
errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from models import build_kernel, tiny_gpt, tokens

from poslab.errors import ConfigError
from poslab.positions import build_scheme, scheme_class
from poslab.positions.hope import HoPE
from poslab.positions.p_rope import PRope
from poslab.positions.resonance import ResonanceRope
from poslab.positions.rope import Rotary
from poslab.positions.ssmax import SSMax

PAIRINGS = ("interleaved", "half")
THETA_SCHEMES = ("p_rope", "hope", "resonance")


def _rope_theta64(rotary_dims: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)


# ---------------------------------------------------------------------------------------------
# p-RoPE


@pytest.mark.parametrize(
    ("head_dim", "proportion", "base"),
    [
        (8, 0.75, 1e4),
        (64, 0.75, 1e4),
        (64, 0.25, 5e5),
        (128, 0.5, 1e6),
        (96, 0.3, 1e4),
        (64, 1, 1e4),
    ],
)
def test_p_rope_theta_is_hugging_faces_proportional_rope(head_dim, proportion, base):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "proportional", "rope_theta": base, "partial_rotary_factor": proportion}
    config = LlamaConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope
    )
    hf, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    ours = PRope(4 * head_dim, 4, proportion=proportion, base=base).frequencies()
    assert attention_factor == 1.0 and ours.dtype == hf.dtype == torch.float32
    assert torch.equal(ours == 0, hf == 0)  # the same pairs are left unrotated
    # the rotated θ agree to 1 ulp: HF computes 1/base^(2i/D), rope base^(−2i/D)
    torch.testing.assert_close(ours, hf, rtol=2.5e-7, atol=0)
    assert (ours > 0).sum() == int(proportion * head_dim // 2) > 0


def test_p_rope_at_p_1_is_rope_and_leaves_the_low_pairs_unrotated():
    assert torch.equal(PRope(32, 4, proportion=1.0).frequencies(), Rotary(32, 4).frequencies())
    q, k = torch.randn(2, 1, 2, 30, 16)
    positions = torch.arange(30) * 37 + 5
    for pairing in PAIRINGS:
        scheme = PRope(32, 2, proportion=0.5, pairing=pairing)  # 4 of 8 pairs rotate
        rq, rk = scheme.rotate(q, k, positions)
        still = (
            slice(8, 16) if pairing == "interleaved" else torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])
        )
        torch.testing.assert_close(rq[..., still], q[..., still], atol=0, rtol=0)  # NoPE dims
        torch.testing.assert_close(rk[..., still], k[..., still], atol=0, rtol=0)
        moved = (
            slice(0, 8) if pairing == "interleaved" else torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
        )
        assert (rq[..., moved] - q[..., moved]).abs().max() > 0.1


# ---------------------------------------------------------------------------------------------
# HoPE


@pytest.mark.parametrize(("train_length", "base"), [(64, 1e4), (512, 1e4), (4096, 5e5), (7, 1e4)])
def test_hope_rotates_exactly_the_pairs_completing_a_period_within_the_training_length(
    train_length, base
):
    scheme = HoPE(256, 4, train_length=train_length, base=base)  # head_dim 64
    theta64 = _rope_theta64(64, base)
    rotating = 2 * math.pi / theta64 <= train_length
    expected = torch.where(rotating, theta64, torch.zeros(()))
    torch.testing.assert_close(scheme.frequencies().double(), expected, rtol=1e-6, atol=0)
    assert torch.equal(scheme.frequencies() > 0, rotating)
    assert scheme.rotating_pairs == int(rotating.sum()) >= 1
    # the wavelengths kept are at most L, the first dropped one beyond it
    kept = 2 * math.pi / scheme.frequencies()[rotating].double()
    assert kept.max() <= train_length
    if not rotating.all():
        assert 2 * math.pi / theta64[int(rotating.sum())] > train_length


def test_hope_follows_the_training_length_and_names_an_impossible_one():
    assert build_scheme("hope", 256, 4, seq_len=512).rotating_pairs == 16
    assert build_scheme("hope", 256, 4, seq_len=4096).rotating_pairs == 23
    with pytest.raises(ConfigError, match=r"pos=hope at pos.train_length=6 rotates no pair"):
        build_scheme("hope", 32, 4, train_length=6)
    with pytest.raises(ConfigError, match=r"pos.train_length=0"):
        build_scheme("hope", 32, 4, train_length=0)


# ---------------------------------------------------------------------------------------------
# Resonance RoPE


@pytest.mark.parametrize(("head_dim", "base"), [(8, 1e4), (64, 1e4), (128, 5e5)])
def test_resonance_theta_is_two_pi_over_the_rounded_wavelength(head_dim, base):
    scheme = ResonanceRope(4 * head_dim, 4, base=base)
    wavelengths64 = torch.round(2 * math.pi / _rope_theta64(head_dim, base))
    expected = 2 * math.pi / wavelengths64
    torch.testing.assert_close(scheme.frequencies().double(), expected, rtol=1.2e-7, atol=0)
    # every wavelength of the fp32 θ' is an integer (to fp32's precision), the one rounded to
    assert torch.equal(scheme.wavelengths.double(), wavelengths64)
    period = 2 * math.pi / scheme.frequencies().double()
    torch.testing.assert_close(period, wavelengths64, rtol=2e-7, atol=0)
    # the reference rounds every pair: the highest frequency 1 becomes 2π/6
    assert scheme.frequencies()[0].item() == pytest.approx(2 * math.pi / 6)


def test_resonance_angles_repeat_exactly_every_wavelength():
    scheme = ResonanceRope(256, 4)  # head_dim 64: wavelengths 6 … 54,410
    m = torch.arange(0, 100_000, 7, dtype=torch.float32)
    angles = scheme.angles(m)
    for i, wavelength in enumerate(scheme.wavelengths.tolist()):
        shifted = scheme.angles(m + wavelength)[:, i]
        assert torch.equal(shifted, angles[:, i]), i  # exact: positions mod λ in fp32
    # and the angle is m·2π/λ' mod 2π (float64 reference): to 1e-6 rad up to m = 10⁵, where
    # m·θ' in fp32 (θ' off by ~1e-7 relatively) would be off by ~3e-3
    reference = m.double()[:, None] * 2 * math.pi / scheme.wavelengths.double()
    apart = torch.remainder(angles.double() - reference + math.pi, 2 * math.pi) - math.pi
    assert apart.abs().max() < 1e-6
    # the rotated q repeats too
    q = torch.randn(1, 1, 1, 64).expand(1, 1, 3, 64)
    first = scheme.rotate(q, q, torch.tensor([5.0, 6.0, 7.0]))[0]
    common = math.lcm(*(int(w) for w in scheme.wavelengths[:3]))  # pairs 0-2 (6, 8, 11)
    later = scheme.rotate(q, q, torch.tensor([5.0, 6.0, 7.0]) + 1000 * common)[0]
    assert torch.equal(later[..., :6], first[..., :6])
    assert not torch.equal(later[..., 6:], first[..., 6:])


# ---------------------------------------------------------------------------------------------
# shared by the three θ variants


@pytest.mark.parametrize("name", THETA_SCHEMES)
def test_theta_variants_are_relative_and_keep_angles_in_fp32_under_bf16(name):
    assert scheme_class(name).shift_invariant
    scheme = build_scheme(name, 64, 4, seq_len=64)
    positions = torch.arange(4000, 4064)
    plain = scheme.prepare(positions).extra["rope"][0]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        under = scheme.prepare(positions).extra["rope"][0]
        q = torch.randn(1, 4, 64, 16).bfloat16()
        rq, _ = scheme.rotate(q, q, positions)
    assert under.dtype == torch.complex64 and torch.equal(under, plain)
    assert rq.dtype == torch.bfloat16


@pytest.mark.parametrize("name", [*THETA_SCHEMES, "ssmax"])
def test_a_learnable_theta_is_refused_where_theta_is_fixed(name):
    if name == "ssmax":
        with pytest.raises(ConfigError, match=r"pos.rotary=false rotates nothing"):
            build_scheme(name, 32, 4, rotary=False, learnable_theta=True)
        assert build_scheme(name, 32, 4, learnable_theta=True).theta_param == "raw"
        return
    with pytest.raises(ConfigError, match=rf"pos={name} fixes θ .*; set pos.learnable_theta=false"):
        build_scheme(name, 32, 4, learnable_theta=True)


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        ("p_rope", {"proportion": 0}, "pos.proportion=0"),
        ("p_rope", {"proportion": 1.5}, "pos.proportion=1.5"),
        ("p_rope", {"proportion": 0.2}, "pos.proportion=0.2 of 8 rotary dims rotates no pair"),
        ("ssmax", {"s_init": 0}, "pos.s_init=0"),
        ("ssmax", {"rotary": "yes"}, "pos.rotary=yes must be true or false"),
        ("ssmax", {"per_layer": 1}, "pos.per_layer=1"),
    ],
)
def test_bad_options_are_one_line_errors_naming_their_key(name, options, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)) as error:
        build_scheme(name, 32, 4, **options)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------
# SSMax


def _ssmax_reference(q, k, v, s, b=None):
    """softmax((s_h·log n + b_h)·q·k/√d) v in float64, n = query index + 1, causal."""
    q, k, v = q.double(), k.double(), v.double()
    T, D = q.shape[-2], q.shape[-1]
    log_n = torch.log(torch.arange(1, T + 1, dtype=torch.float64))[:, None]
    factor = s.double()[:, None, None] * log_n + (0 if b is None else b.double()[:, None, None])
    scores = factor * (q @ k.transpose(-1, -2)) / math.sqrt(D)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores, scores.softmax(-1) @ v


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_ssmax_scores_are_s_log_n_times_q_k(rotary, bias):
    torch.manual_seed(0)
    scheme = SSMax(16, 2, rotary=rotary, bias=bias, n_layer=1)
    with torch.no_grad():
        scheme.s.copy_(torch.tensor([[0.3, 1.7]]))
        if bias:
            scheme.b.copy_(torch.tensor([[0.5, -0.25]]))
    q, k, v = torch.randn(3, 2, 2, 20, 8)
    positions = torch.arange(20) + 100
    rq, rk = scheme.rotate(q, k, positions)
    if rotary:  # the rotation is rope's, the factor applies on top
        q, k = Rotary(16, 2).rotate(q, k, positions)
        assert torch.equal(rk, k)
    else:
        assert torch.equal(rk, k)
    scores = (rq.double() @ rk.double().transpose(-1, -2)) / math.sqrt(8)
    reference, out = _ssmax_reference(q, k, v, scheme.s[0], None if not bias else scheme.b[0])
    for t, u in [(0, 0), (1, 0), (7, 3), (19, 0), (19, 19), (12, 11)]:
        torch.testing.assert_close(scores[..., t, u], reference[..., t, u], atol=1e-5, rtol=1e-5)
    attention = F.scaled_dot_product_attention(rq, rk, v, is_causal=True)
    torch.testing.assert_close(attention.double(), out, atol=1e-5, rtol=1e-5)


def test_ssmax_counts_keys_by_index_not_by_position():
    scheme = SSMax(16, 2, rotary=False)
    q = torch.randn(2, 2, 10, 8)
    base = scheme.rotate(q, q, torch.arange(10))[0]
    for positions in (torch.arange(10) + 1000, torch.arange(10) * 3, torch.arange(20).view(2, 10)):
        torch.testing.assert_close(scheme.rotate(q, q, positions)[0], base, atol=0, rtol=0)
    assert scheme_class("ssmax").shift_invariant


def test_ssmax_s_is_trainable_per_head_and_layer_and_gets_gradients():
    model = tiny_gpt("ssmax")
    s = model.pos.s
    assert s.requires_grad and s.shape == (2, 4)  # per layer (the default) and head
    assert "s" in dict(model.pos.named_parameters()) and "pos.s" in model.state_dict()
    model.train()
    model(tokens(2, 16)).logsumexp(-1).mean().backward()
    assert s.grad is not None and (s.grad.abs() > 0).all()
    shared = build_scheme("ssmax", 32, 4, per_layer=False, n_layer=2)
    assert shared.s.shape == (1, 4)
    q = torch.randn(1, 4, 8, 8)
    assert torch.equal(
        shared.rotate(q, q, torch.arange(8), 0)[0], shared.rotate(q, q, torch.arange(8), 1)[0]
    )
    with torch.no_grad():
        model.pos.s[1] += 1.0
    assert not torch.equal(
        model.pos.rotate(q, q, torch.arange(8), 0)[0], model.pos.rotate(q, q, torch.arange(8), 1)[0]
    )


def test_ssmax_scales_queries_in_fp32_under_bf16_and_linear_attention_refuses_it():
    scheme = SSMax(32, 4, n_layer=1)
    q = torch.randn(1, 4, 300, 8)
    reference = scheme.rotate(q, q, torch.arange(300))[0]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        rq, _ = scheme.rotate(q.bfloat16(), q.bfloat16(), torch.arange(300))
    assert rq.dtype == torch.bfloat16
    torch.testing.assert_close(rq.float(), reference, atol=0.05, rtol=0.02)
    assert scheme.scales_scores
    with pytest.raises(ConfigError, match="attention=linear cannot take"):
        build_kernel("linear").check(scheme, 0.0)
