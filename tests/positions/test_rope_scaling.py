"""Eval-time RoPE context extension (positions/rope_scaling.py): every kind against its formula
on hand-computed values, the equivalences the papers state, and the evaluation path end to end."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import eval_cfg, score_checkpoint, train_in_process
from models import VOCAB, tiny_gpt, tokens

from poslab.errors import ConfigError
from poslab.positions import build_scheme, scheme_configs
from poslab.positions.rope import rope_theta
from poslab.positions.rope_scaling import (
    RopeScaling,
    eval_overrides,
    eval_variant_label,
    eval_variant_options,
    resolve_factor,
    train_scaling_options,
)

D_MODEL, N_HEAD = 64, 4  # head_dim 16
LAYOUTS = [("interleaved", 1.0), ("half", 1.0), ("interleaved", 0.5), ("half", 0.5)]


def rope(pairing: str = "interleaved", fraction: float = 1.0, **scaling) -> torch.nn.Module:
    options = {"kind": "none", "train_length": 64, **scaling} if scaling else None
    return build_scheme(
        "rope", D_MODEL, N_HEAD, pairing=pairing, fraction=fraction, scaling=options
    )


def qk(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, N_HEAD, length, D_MODEL // N_HEAD, generator=generator)


def scores(scheme, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The rotary q·k scores (B, H, T, T) the scheme gives, through the kernel's hooks."""
    prepared = scheme.prepare(positions)
    q, k = scheme.rotate(q, k, prepared)
    raw = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if scheme.needs != "scores":
        return raw
    future = positions[None, :] > positions[:, None]
    fp32 = prepared.fp32
    return scheme.modify_scores(raw, q.float(), k.float(), future, fp32, fp32)


# ---- the formulas, by hand ------------------------------------------------------------------


def test_ntk_and_yarn_frequencies_match_hand_computed_values():
    theta = rope_theta(8, 10000.0)  # [1, 0.1, 0.01, 0.001]
    assert theta.tolist() == pytest.approx([1, 0.1, 0.01, 0.001], rel=1e-6)
    ntk = RopeScaling("ntk", 4.0, 512).theta(theta, 8, 2048)
    alpha = 4 ** (8 / 6)  # base' = base·s^(R/(R−2))
    assert ntk.tolist() == pytest.approx(
        [1, 0.1 / alpha**0.25, 0.01 / alpha**0.5, 0.001 / alpha**0.75], rel=1e-5
    )
    # YaRN at L = 512: r_i = 512·θ_i/2π = 81.5, 8.15, 0.815, 0.0815 turns; α = 1, β = 32
    yarn = RopeScaling("yarn", 4.0, 512).theta(theta, 8, 2048)
    gamma = (512 * 0.1 / (2 * math.pi) - 1) / 31
    assert yarn.tolist() == pytest.approx(
        [1.0, (1 - gamma) * 0.1 / 4 + gamma * 0.1, 0.01 / 4, 0.001 / 4], rel=1e-5
    )
    assert RopeScaling("yarn", 4.0, 512).attention_factor == pytest.approx(0.1 * math.log(4) + 1)


def test_dynamic_ntk_follows_the_length_of_the_forward():
    theta = rope_theta(16, 10000.0)
    dynamic = RopeScaling("dynamic_ntk", 2.0, 64)
    assert torch.equal(dynamic.theta(theta, 16, 64), theta)  # T ≤ L: untouched
    base = 10000.0 * (2 * 256 / 64 - 1) ** (16 / 14)  # HF: base·((s·T/L) − (s−1))^(R/(R−2))
    assert torch.allclose(dynamic.theta(theta, 16, 256), rope_theta(16, base), rtol=1e-5)
    assert resolve_factor("dynamic_ntk", "auto", 1024, 64) == 1.0  # reads the length itself
    assert resolve_factor("pi", "auto", 1024, 64) == 16.0
    assert resolve_factor("pi", "auto", 32, 64) == 1.0


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
def test_pi_equals_positions_divided_by_s(pairing, fraction):
    positions = torch.arange(256)
    q, k = qk(256)
    scaled = rope(pairing, fraction, kind="pi", factor=4.0)
    plain = rope(pairing, fraction)
    assert torch.allclose(
        scores(scaled, positions, q, k), scores(plain, positions / 4, q, k), atol=1e-5
    )


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
@pytest.mark.parametrize("kind", ["ntk", "dynamic_ntk"])
def test_ntk_kinds_change_only_the_base(kind, pairing, fraction):
    positions = torch.arange(256)
    q, k = qk(256)
    scaled = rope(pairing, fraction, kind=kind, factor=4.0)
    rotary_dims = scaled.rotary_dims
    power = rotary_dims / (rotary_dims - 2)
    alpha = 4.0**power if kind == "ntk" else (4 * 256 / 64 - 3) ** power
    plain = build_scheme(
        "rope", D_MODEL, N_HEAD, pairing=pairing, fraction=fraction, base=10000.0 * alpha
    )
    assert torch.allclose(
        scores(scaled, positions, q, k), scores(plain, positions, q, k), atol=1e-4
    )


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
def test_yarn_keeps_fast_dims_interpolates_slow_ones_and_scales_the_temperature(pairing, fraction):
    scaling = RopeScaling("yarn", 8.0, 64, beta_fast=8.0, beta_slow=1.0)
    scheme = rope(pairing, fraction, kind="yarn", factor=8.0, beta_fast=8.0)
    theta = scheme.frequencies()
    turns = 64 * theta / (2 * math.pi)
    new = scaling.theta(theta, scheme.rotary_dims, 512)
    assert (turns > 8).any() and (turns < 1).any()  # both ends are tested
    assert torch.equal(new[turns > 8], theta[turns > 8])  # extrapolated: untouched
    assert torch.equal(new[turns < 1], theta[turns < 1] / 8)  # interpolated: exactly PI
    # the temperature: each rotated q and k grows by 0.1·ln s + 1, so q·k by its square
    q, k = qk(16)
    prepared = scheme.prepare(torch.arange(16))
    q_rot, _ = scheme.rotate(q, k, prepared)
    r = scheme.rotary_dims
    factor = 0.1 * math.log(8) + 1
    assert torch.allclose(q_rot[..., :r].norm(dim=-1), factor * q[..., :r].norm(dim=-1), rtol=1e-5)
    assert torch.equal(q_rot[..., r:], q[..., r:])


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
@pytest.mark.parametrize("leaky", [None, 4.0])
def test_rerope_is_plain_inside_the_window_and_as_documented_beyond(pairing, fraction, leaky):
    window, length = 16, 64
    scheme = rope(pairing, fraction, kind="rerope", window=window, leaky=leaky)
    assert scheme.needs == "scores"
    positions = torch.arange(length)
    q, k = qk(length)
    got = scores(scheme, positions, q, k)
    plain = scores(rope(pairing, fraction), positions, q, k)
    distance = positions[:, None] - positions[None, :]
    inside = (distance >= 0) & (distance < window)
    assert torch.allclose(got[..., inside], plain[..., inside], atol=1e-5)
    # beyond: the plain rotary score of the same vectors at the documented relative distance
    far = distance >= window
    m, n = torch.nonzero(far, as_tuple=True)
    effective = (
        torch.full_like(m, window, dtype=torch.float32)
        if leaky is None
        else (window + (m - n - window) / leaky)
    )
    plain_scheme = rope(pairing, fraction)
    qm = plain_scheme.rotate(q[:, :, m], q[:, :, m], effective)[0]  # q at the distance, k at 0
    kn = plain_scheme.rotate(k[:, :, n], k[:, :, n], torch.zeros_like(effective))[1]
    expected = (qm * kn).sum(-1) * q.shape[-1] ** -0.5
    assert torch.allclose(got[..., m, n], expected, atol=1e-4)


def test_rerope_is_constant_in_distance_beyond_the_window():
    window = 8
    scheme = rope(kind="rerope", window=window)
    positions = torch.arange(48)
    q, k = qk(1)
    q, k = q.expand(-1, -1, 48, -1), k.expand(-1, -1, 48, -1)  # the same vectors everywhere
    got = scores(scheme, positions, q, k)
    distance = positions[:, None] - positions[None, :]
    beyond = got[..., distance >= window]
    assert torch.allclose(beyond, beyond[..., :1].expand_as(beyond), atol=1e-5)
    inside = got[..., (distance > 0) & (distance < window)]
    assert not torch.allclose(inside, inside[..., :1].expand_as(inside))  # rotary inside


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
def test_logn_scales_queries_past_the_training_length_only(pairing, fraction):
    scheme = rope(pairing, fraction, logn=True)
    plain = rope(pairing, fraction)
    positions = torch.arange(256)
    q, k = qk(256)
    got_q, got_k = scheme.rotate(q, k, scheme.prepare(positions))
    want_q, want_k = plain.rotate(q, k, plain.prepare(positions))
    assert torch.equal(got_k, want_k)
    factor = torch.clamp(torch.log(positions + 1.0) / math.log(64), min=1.0)
    assert torch.equal(got_q[..., :63, :], want_q[..., :63, :])
    assert torch.allclose(got_q, want_q * factor[:, None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["none", "pi", "ntk", "yarn"])
def test_factor_one_is_bit_identical_to_no_scaling(kind):
    positions = torch.arange(128)
    q, k = qk(128)
    scaled = rope(kind=kind, factor=1.0)
    assert torch.equal(scores(scaled, positions, q, k), scores(rope(), positions, q, k))
    cfg = eval_cfg(rope_scaling={"kind": kind, "factor": "auto"})
    pos_cfg = {"_target_": "poslab.positions.rope.Rotary"}
    assert eval_overrides(cfg, pos_cfg, 64, 64) == {}  # 1×: the trained model itself


def test_bad_scaling_options_are_one_line_errors():
    pos_cfg = {"_target_": "poslab.positions.alibi.ALiBi"}
    with pytest.raises(ConfigError, match="act on rotary schemes"):
        eval_overrides(eval_cfg(rope_scaling={"kind": "pi"}), pos_cfg, 256, 64)
    rotary = {"_target_": "poslab.positions.rope.Rotary"}
    for scaling, match in [
        ({"kind": "bogus"}, "eval.rope_scaling.kind='bogus'"),
        ({"kind": "pi", "factor": 0.5}, "eval.rope_scaling.factor=0.5"),
        ({"kind": "pi", "factor": "big"}, "eval.rope_scaling.factor=big"),
        ({"kind": "yarn", "beta_fast": 1, "beta_slow": 2}, "beta_slow=2"),
        ({"kind": "rerope", "window": 0}, "eval.rope_scaling.window=0"),
        ({"kind": "rerope", "leaky": 1}, "eval.rope_scaling.leaky=1"),
        ({"kind": "pi", "windw": 3}, "windw"),
    ]:
        with pytest.raises(ConfigError, match=match):
            eval_overrides(eval_cfg(rope_scaling=scaling), rotary, 256, 64)
    with pytest.raises(ConfigError, match="defined for plain rotary"):
        build_scheme("xpos", D_MODEL, N_HEAD, scaling={"kind": "rerope", "train_length": 64})


def test_an_option_the_kind_does_not_read_is_refused():
    """#60: `kind=yarn shift=5` (STRING's S) and `kind=string factor=4` were accepted and
    scored as plain yarn and plain STRING; an option at its default (beta_fast 32, which every
    recorded config holds) stays accepted."""
    rotary = {"_target_": "poslab.positions.rope.Rotary"}
    for scaling, match in [
        ({"kind": "yarn", "shift": 5}, "shift=5 is an option of string, which kind=yarn does not"),
        ({"kind": "string", "factor": 4}, "factor=4: kind=string reads no factor"),
        ({"kind": "none", "window": 8}, "window=8 is an option of dpe, lminfinite, rerope"),
        ({"kind": "pi", "beta_fast": 64}, "beta_fast=64 is an option of yarn"),
    ]:
        with pytest.raises(ConfigError, match=match):
            eval_overrides(eval_cfg(rope_scaling=scaling), rotary, 256, 64)
    with pytest.raises(ConfigError, match="pos.scaling.group=2 is an option of selfextend"):
        train_scaling_options({"kind": "pi", "group": 2})
    # a train-time kind is told its own keys (#60: longrope was told eval.rope_scaling.*)
    with pytest.raises(ConfigError) as told:
        train_scaling_options({"kind": "longrope"})
    assert "+pos.scaling.long_factor and short_factor" in str(told.value)
    assert "eval.rope_scaling" not in str(told.value)
    at_defaults = {"kind": "string", "beta_fast": 32, "beta_slow": 1, "factor": "auto"}
    assert eval_overrides(eval_cfg(rope_scaling=at_defaults), rotary, 256, 64)["scaling"]


@pytest.mark.parametrize(
    "scaling",
    [{"kind": "dynamic_ntk", "factor": 2.0}, {"logn": True}, {"kind": "rerope", "window": 16}],
)
def test_scaled_rotary_stays_relative_under_a_position_offset(scaling):
    scheme = rope(**scaling)
    positions = torch.arange(256)
    q, k = qk(256)
    shifted = scores(scheme, positions + 1000, q, k)
    assert torch.allclose(shifted, scores(scheme, positions, q, k), atol=2e-3)


def test_eval_overrides_keep_what_acts_at_1x_and_apply_a_fixed_factor():
    rotary = {"_target_": "poslab.positions.rope.Rotary"}

    def at(length: int, **scaling) -> dict:
        logn = scaling.pop("logn", False)
        return eval_overrides(eval_cfg(rope_scaling=scaling, logn_scaling=logn), rotary, length, 64)

    assert at(64, logn=True)["scaling"]["logn"] is True  # acts on any window past L
    assert at(64, kind="dynamic_ntk")["scaling"]["factor"] == 1.0
    assert at(32, kind="pi", factor=4)["scaling"]["factor"] == 4.0  # fixed: at every length
    assert at(1024, kind="pi")["scaling"]["factor"] == 16.0
    # kinds that ignore the factor get one set of overrides (one model) for every length
    assert at(64, kind="rerope") == at(1024, kind="rerope")
    assert at(64, logn=True) == at(1024, logn=True)
    for scaling in ({"kind": "pi", "logn": True}, {"kind": "pi", "train_length": 1}):
        given = next(k for k in scaling if k != "kind")
        with pytest.raises(ConfigError, match=f"eval.rope_scaling.{given} is not an option"):
            eval_overrides(eval_cfg(rope_scaling=scaling), rotary, 128, 64)
    two_dims = build_scheme(
        "rope", 8, 1, fraction=0.25, scaling={"kind": "ntk", "factor": 2.0, "train_length": 4}
    )
    with pytest.raises(ConfigError, match="undefined for R = 2"):
        two_dims.prepare(torch.arange(8))


# ---- end to end: eval.py's path on a trained rope checkpoint ----------------------------------

KINDS = [
    {"kind": "pi"},
    {"kind": "ntk"},
    {"kind": "dynamic_ntk"},
    {"kind": "yarn"},
    {"kind": "rerope"},
    {"kind": "rerope", "leaky": 4.0},
]


@pytest.fixture(scope="module")
def rope_checkpoints(trained_runs, corpus, tmp_path_factory) -> dict[str, object]:
    """A trained rope checkpoint in each pairing."""
    half = tmp_path_factory.mktemp("half") / "run"
    train_in_process("rope", corpus, half, ["pos.pairing=half"])
    interleaved = trained_runs["rope"][0]
    return {
        p: r / "checkpoints" / "best.ckpt"
        for p, r in [("interleaved", interleaved), ("half", half)]
    }


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_every_kind_evaluates_a_rope_checkpoint_at_16x(rope_checkpoints, pairing):
    ckpt = rope_checkpoints[pairing]
    plain = score_checkpoint(ckpt, eval_cfg(factors=[1, 16]))
    base = {r["length"]: r for r in plain}
    for scaling in KINDS:
        for logn in (False, True):
            cfg = eval_cfg(factors=[1, 16], rope_scaling=scaling, logn_scaling=logn)
            rows = score_checkpoint(ckpt, cfg)
            by_length = {r["length"]: r for r in rows}
            assert all(r["status"] == "ok" and math.isfinite(r["ppl"]) for r in rows)
            assert by_length[256]["ppl"] != base[256]["ppl"], scaling  # it acted at 16×
            assert rows[0]["scheme"].startswith("rope + ")
            if scaling["kind"] in ("pi", "ntk", "yarn") and not logn:  # identity at 1×
                assert by_length[16]["ppl"] == base[16]["ppl"]


@pytest.mark.parametrize("scheme", ["mrope", "rope2d"])
def test_rope_scaling_of_a_multi_axis_scheme_names_the_eval_keys(scheme):
    pos_cfg = scheme_configs()[scheme]
    eval_cfg = {"rope_scaling": {"kind": "yarn"}, "logn_scaling": True}
    with pytest.raises(ConfigError) as err:
        eval_overrides(eval_cfg, pos_cfg, 256, 64)
    message = str(err.value)
    assert message.startswith("eval.rope_scaling.kind=yarn and eval.logn_scaling=true:")
    assert "eval.rope_scaling.kind=none" in message and "pos.scaling" not in message


# ---- merged from test_rope_scaling_current.py ----
# The eval-time RoPE kinds of current models (positions/rope_scaling.py): llama3, longrope and
# YaRN's reference ramp against Hugging Face transformers' own functions, selfextend and
# lminfinite against their formulas in float64, causality through a tiny model, and the
# configuration path (eval.rope_scaling.kind=<kind>).
NEW_KINDS = ("llama3", "longrope", "selfextend", "lminfinite")
ROTARY = {"_target_": "poslab.positions.rope.Rotary"}


def longrope_lists(pairs: int) -> dict[str, list[float]]:
    """Factors shaped like Phi-3's: about 1 for the fast pairs, growing for the slow ones."""
    return {
        "long_factor": [1.0 + 0.5 * i**1.5 for i in range(pairs)],
        "short_factor": [1.0 + 0.01 * i for i in range(pairs)],
    }


# ---- against Hugging Face transformers ------------------------------------------------------

transformers = pytest.importorskip("transformers")


def hf_frequencies(rope_parameters: dict, head_dim: int, seq_len: int | None = None):
    """HF's (inv_freq, attention_factor) for a Llama config with these rope_parameters."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=1 << 16,
        rope_parameters=rope_parameters,
    )
    return ROPE_INIT_FUNCTIONS[rope_parameters["rope_type"]](config, "cpu", seq_len=seq_len)


def poslab_rope(head_dim: int, base: float, fraction: float, **scaling):
    return build_scheme(
        "rope", 4 * head_dim, 4, base=base, fraction=fraction, pairing="half", scaling=scaling
    )


def theta_of(scheme, length: int) -> torch.Tensor:
    """θ' of a forward over `length` positions: the angles at position 1."""
    return scheme.angles(torch.ones(1), length)[0]


# (head_dim, base, fraction, train length L, factor s): slow and fast bases, partial rotary
SETUPS = [
    (64, 10000.0, 1.0, 512, 8.0),
    (128, 500000.0, 1.0, 8192, 4.0),
    (16, 10000.0, 0.5, 64, 16.0),
    (64, 10000.0, 1.0, 64, 2.5),
]


@pytest.mark.parametrize("head_dim,base,fraction,train_length,factor", SETUPS)
@pytest.mark.parametrize("low,high", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_equals_hugging_face(head_dim, base, fraction, train_length, factor, low, high):
    scheme = poslab_rope(
        head_dim,
        base,
        fraction,
        kind="llama3",
        factor=factor,
        train_length=train_length,
        low_freq_factor=low,
        high_freq_factor=high,
    )
    inv_freq, attention = hf_frequencies(
        {
            "rope_type": "llama3",
            "rope_theta": base,
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": train_length,
            "partial_rotary_factor": fraction,
        },
        head_dim,
    )
    assert inv_freq.shape == (scheme.rotary_dims // 2,)
    torch.testing.assert_close(theta_of(scheme, 4 * train_length), inv_freq, rtol=1e-5, atol=0)
    assert scheme.scaling.attention_factor == attention == 1.0
    # all three regions are exercised somewhere in SETUPS
    theta = scheme.frequencies()
    assert not torch.equal(inv_freq, theta)


def test_llama3_regions_cover_kept_interpolated_and_smoothed():
    theta = rope_theta(64, 10000.0)
    new = RopeScaling("llama3", 8.0, 512).theta(theta, 64, 4096)
    wavelength = 2 * math.pi / theta
    kept, slow = wavelength < 512 / 4, wavelength > 512
    between = ~kept & ~slow
    assert kept.any() and slow.any() and between.any()
    assert torch.equal(new[kept], theta[kept])
    assert torch.equal(new[slow], theta[slow] / 8)
    smooth = (512 / wavelength[between] - 1) / 3
    torch.testing.assert_close(
        new[between], (1 - smooth) * theta[between] / 8 + smooth * theta[between]
    )


@pytest.mark.parametrize("head_dim,base,fraction,train_length,factor", SETUPS)
@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0)])
def test_yarn_reference_ramp_equals_hugging_face(
    head_dim, base, fraction, train_length, factor, truncate, betas
):
    beta_fast, beta_slow = betas
    scheme = poslab_rope(
        head_dim,
        base,
        fraction,
        kind="yarn",
        ramp="reference",
        truncate=truncate,
        factor=factor,
        train_length=train_length,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
    )
    inv_freq, attention = hf_frequencies(
        {
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "truncate": truncate,
            "original_max_position_embeddings": train_length,
            "partial_rotary_factor": fraction,
        },
        head_dim,
    )
    torch.testing.assert_close(theta_of(scheme, 4 * train_length), inv_freq, rtol=1e-5, atol=0)
    assert scheme.scaling.attention_factor == pytest.approx(attention, rel=1e-12)
    # the temperature reaches cos and sin (half pairing: cos² + sin² = factor²)
    cos, sin = scheme.prepare(torch.arange(8)).extra["rope"]
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, attention**2))


def test_yarn_reference_ramp_without_a_base_reads_it_off_theta():
    theta = rope_theta(64, 10000.0)
    scaling = RopeScaling("yarn", 8.0, 512, ramp="reference")
    torch.testing.assert_close(
        scaling.theta(theta, 64, 4096), scaling.theta(theta, 64, 4096, base=10000.0)
    )


def test_yarn_default_ramp_is_the_paper_one_and_differs_from_the_reference():
    assert RopeScaling("yarn", 4.0, 64).ramp == "paper"
    nulls = RopeScaling("yarn", 4.0, 64, ramp=None, truncate=None)
    assert (nulls.ramp, nulls.truncate) == ("paper", True)
    theta = rope_theta(64, 10000.0)  # the module docstring's example: R=64, L=512, s=8, pair 7
    paper = RopeScaling("yarn", 8.0, 512).yarn_ramp(theta, 64, 10000.0)
    reference = RopeScaling("yarn", 8.0, 512, ramp="reference").yarn_ramp(theta, 64, 10000.0)
    assert paper[7].item() == pytest.approx(0.32, abs=0.005)
    assert reference[7].item() == pytest.approx(0.69, abs=0.005)


@pytest.mark.parametrize("head_dim,base,fraction,train_length,factor", SETUPS)
def test_longrope_equals_hugging_face_short_and_long(
    head_dim, base, fraction, train_length, factor
):
    pairs = round(head_dim * fraction) // 2
    lists = longrope_lists(pairs)
    scheme = poslab_rope(
        head_dim, base, fraction, kind="longrope", factor=factor, train_length=train_length, **lists
    )
    parameters = {
        "rope_type": "longrope",
        "rope_theta": base,
        "factor": factor,
        "original_max_position_embeddings": train_length,
        "partial_rotary_factor": fraction,
        **lists,
    }
    short, attention = hf_frequencies(parameters, head_dim, seq_len=train_length)
    long, attention_long = hf_frequencies(parameters, head_dim, seq_len=train_length + 1)
    assert not torch.allclose(short, long)
    torch.testing.assert_close(theta_of(scheme, train_length), short, rtol=1e-5, atol=0)
    torch.testing.assert_close(theta_of(scheme, train_length + 1), long, rtol=1e-5, atol=0)
    want = math.sqrt(1 + math.log(factor) / math.log(train_length))
    assert scheme.scaling.attention_factor == pytest.approx(attention, rel=1e-12)
    assert attention == attention_long == pytest.approx(want)
    # prepare picks the list by the window's span (HF: max position + 1), at any offset
    for offset in (0, 1000):
        for length, inv_freq in ((train_length, short), (train_length + 1, long)):
            positions = torch.arange(length) + offset
            cos, _ = scheme.prepare(positions).extra["rope"]
            want = torch.cos(positions.double()[:, None] * inv_freq.double()) * attention
            torch.testing.assert_close(cos.double(), want, atol=2e-3, rtol=0)


def test_longrope_at_factor_one_applies_its_short_factors_and_no_temperature():
    lists = {"long_factor": [2.0] * 8, "short_factor": [1.0] * 8}
    scheme = build_scheme("rope", 64, 4, scaling={"kind": "longrope", "train_length": 64, **lists})
    plain = build_scheme("rope", 64, 4)
    assert scheme.scaling.attention_factor == 1.0 and not scheme.scales_scores
    positions = torch.arange(64)
    q, k = torch.randn(2, 1, 4, 64, 16, generator=torch.Generator().manual_seed(0))
    # short factors of 1 up to L: bit-identical to the trained model
    assert all(
        torch.equal(a, b)
        for a, b in zip(scheme.rotate(q, k, positions), plain.rotate(q, k, positions), strict=True)
    )
    # past L the long factors act
    longer = torch.arange(65)
    q, k = torch.randn(2, 1, 4, 65, 16, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(scheme.rotate(q, k, longer)[0], plain.rotate(q, k, longer)[0])


# ---- selfextend and lminfinite against their formulas, in float64 ---------------------------


def rotate64(
    x: torch.Tensor,
    position: torch.Tensor,
    theta: torch.Tensor,
    pairing: str,
    r: int,
    per_pair: bool = False,
):
    """x (…, D) turned by position·θ in float64 (rotary dims r), by hand; `per_pair`: position
    (…, R/2) gives each pair its own (dpe's bands)."""
    x = x.double().clone()
    position = position.double() if per_pair else position.double()[..., None]
    angles = position * theta.double()
    cos, sin = torch.cos(angles), torch.sin(angles)
    if pairing == "interleaved":
        a, b = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., : r // 2].clone(), x[..., r // 2 : r].clone()
        x[..., : r // 2], x[..., r // 2 : r] = a * cos - b * sin, a * sin + b * cos
    return x


def score64(q, k, qpos, kpos, scheme) -> torch.Tensor:
    """The q·k/sqrt(D) of q at qpos and k at kpos (per entry), in float64."""
    theta, r = scheme.frequencies(), scheme.rotary_dims
    qr = rotate64(q, torch.as_tensor(qpos), theta, scheme.pairing, r)
    kr = rotate64(k, torch.as_tensor(kpos), theta, scheme.pairing, r)
    return (qr * kr).sum(-1) / math.sqrt(q.shape[-1])


def kernel_scores(scheme, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    """What the blockwise kernel hands softmax (before it masks the future), through the hooks."""
    prepared = scheme.prepare(positions)
    q_in, k_in = scheme.rotate(q, k, prepared)
    raw = q_in @ k_in.transpose(-1, -2) * q.shape[-1] ** -0.5
    future = positions[None, :] > positions[:, None]
    fp32 = prepared.fp32
    return scheme.modify_scores(raw, q_in.float(), k_in.float(), future, fp32, fp32)


FEW_LAYOUTS = [("interleaved", 1.0), ("half", 0.5)]  # both pairings, all dims and half of them


@pytest.mark.parametrize("pairing,fraction", FEW_LAYOUTS)
@pytest.mark.parametrize("group,window", [(3, 8), (4, 8), (2, None)])
@pytest.mark.parametrize("offset", [0, 37])
def test_selfextend_equals_its_formula(pairing, fraction, group, window, offset):
    train_length, length = 16, 48
    scheme = build_scheme(
        "rope",
        64,
        4,
        pairing=pairing,
        fraction=fraction,
        scaling={
            "kind": "selfextend",
            "train_length": train_length,
            "group": group,
            "window": window,
        },
    )
    assert scheme.needs == "scores"
    w = window or train_length // 4
    positions = torch.arange(length) + offset
    q, k = torch.randn(2, 1, 4, length, 16, generator=torch.Generator().manual_seed(1))
    got = kernel_scores(scheme, positions, q, k)
    m, n = torch.tril_indices(length, length)  # token indices m ≥ n (the future is masked later)
    near = (m - n) < w
    qpos = torch.where(near, m + offset, m // group + w - w // group)  # from the window's start
    kpos = torch.where(near, n + offset, n // group)
    expected = score64(q[..., m, :], k[..., n, :], qpos, kpos, scheme)
    torch.testing.assert_close(got[..., m, n].double(), expected, atol=2e-5, rtol=1e-5)
    assert (~near).any() and near.any()


@pytest.mark.parametrize("pairing,fraction", FEW_LAYOUTS)
@pytest.mark.parametrize("n_global,window", [(3, 8), (0, 5), (10, None), (2, 24)])
@pytest.mark.parametrize("offset", [0, 37])
def test_lminfinite_equals_its_formula(pairing, fraction, n_global, window, offset):
    train_length, length = 16, 48
    scheme = build_scheme(
        "rope",
        64,
        4,
        pairing=pairing,
        fraction=fraction,
        scaling={
            "kind": "lminfinite",
            "train_length": train_length,
            "n_global": n_global,
            "window": window,
        },
    )
    w = window or train_length
    positions = torch.arange(length) + offset
    q, k = torch.randn(2, 1, 4, length, 16, generator=torch.Generator().manual_seed(2))
    got = kernel_scores(scheme, positions, q, k)
    m, n = torch.tril_indices(length, length)
    seen = ((m - n) < w) | (n < n_global)
    capped = (m - n) >= train_length  # seen at distance L: q at L, k at 0
    qpos = torch.where(capped, train_length, m + offset)
    kpos = torch.where(capped, 0, n + offset)
    expected = score64(q[..., m, :], k[..., n, :], qpos, kpos, scheme)
    expected = expected.masked_fill(~seen, float("-inf"))
    torch.testing.assert_close(got[..., m, n].double(), expected, atol=2e-5, rtol=1e-5)
    # the Λ: every row keeps its own key, so softmax never sees a row of −inf
    future = positions[None, :] > positions[:, None]
    weights = torch.softmax(got.masked_fill(future, float("-inf")), dim=-1)
    assert torch.isfinite(weights).all()
    assert torch.equal(torch.isinf(got[..., m, n]), ~seen.expand_as(got[..., m, n]))


def test_lminfinite_with_the_window_of_l_caps_like_rerope_at_l():
    positions = torch.arange(40)
    q, k = torch.randn(2, 1, 4, 40, 16, generator=torch.Generator().manual_seed(3))
    lm = build_scheme(
        "rope", 64, 4, scaling={"kind": "lminfinite", "train_length": 16, "n_global": 40}
    )
    rerope = build_scheme("rope", 64, 4, scaling={"kind": "rerope", "train_length": 16})
    torch.testing.assert_close(
        kernel_scores(lm, positions, q, k), kernel_scores(rerope, positions, q, k)
    )


@pytest.mark.parametrize(
    "scaling",
    [
        {"kind": "selfextend", "group": 3, "window": 5},
        {"kind": "lminfinite", "n_global": 2, "window": 6},
        {"kind": "llama3", "factor": 4.0},
        {"kind": "yarn", "factor": 4.0, "ramp": "reference"},
        {"kind": "longrope", "factor": 4.0, **longrope_lists(4)},
    ],
    ids=lambda s: s["kind"] + ("-ref" if s.get("ramp") else ""),
)
def test_new_kinds_stay_causal_and_blockwise_in_a_tiny_model(scaling):
    """Changing later tokens never changes earlier logits, and the blockwise kernel's blocks
    (queries start..end over keys 0..end) give what one block gives."""
    options = {"scaling": {"train_length": 8, **scaling}}
    one_block = tiny_gpt("rope", kernel="blockwise", **options)
    blocks = tiny_gpt("rope", kernel="blockwise", kernel_options={"block_size": 7}, **options)
    plain = tiny_gpt("rope", kernel="blockwise")
    idx = tokens(2, 40)
    changed = idx.clone()
    changed[:, 25:] = (changed[:, 25:] + 1) % VOCAB
    with torch.no_grad():
        logits = one_block(idx)
        torch.testing.assert_close(one_block(changed)[:, :25], logits[:, :25])
        torch.testing.assert_close(blocks(idx), logits, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(logits).all()
        assert not torch.allclose(plain(idx), logits)  # it acts at 5× the training length


# ---- the configuration path --------------------------------------------------------------------


def test_new_kinds_are_accepted_and_labelled():
    for kind in NEW_KINDS:
        extra = longrope_lists(8) if kind == "longrope" else {}
        cfg = eval_cfg(rope_scaling={"kind": kind, **extra})
        assert eval_variant_options(cfg)["kind"] == kind
        overrides = eval_overrides(cfg, ROTARY, 256, 64)["scaling"]
        assert overrides["train_length"] == 64
        scheme = build_scheme("rope", 64, 4, scaling=overrides)
        assert scheme.scaling.kind == kind
    label = eval_variant_label
    assert label(eval_cfg(rope_scaling={"kind": "llama3"})) == "llama3 s=auto"
    assert label(eval_cfg(rope_scaling={"kind": "longrope", **longrope_lists(8)})) == (
        "longrope s=auto"
    )
    assert label(eval_cfg(rope_scaling={"kind": "yarn", "factor": 4, "ramp": "reference"})) == (
        "yarn s=4 ramp=ref"
    )
    assert label(eval_cfg(rope_scaling={"kind": "selfextend"}, logn_scaling=True)) == (
        "selfextend G=4 w=L/4 +logn"
    )
    assert label(eval_cfg(rope_scaling={"kind": "lminfinite", "window": 32})) == (
        "lminfinite g=10 w=32"
    )
    assert label(eval_cfg(rope_scaling={"kind": "yarn"})) == "yarn s=auto"  # unchanged


def test_factors_of_the_new_kinds():
    for kind in ("selfextend", "lminfinite"):
        assert resolve_factor(kind, "auto", 1024, 64) == 1.0
        assert resolve_factor(kind, 8, 1024, 64) == 1.0
        cfg = eval_cfg(rope_scaling={"kind": kind})
        assert eval_overrides(cfg, ROTARY, 64, 64) == eval_overrides(cfg, ROTARY, 1024, 64)
    for kind in ("llama3", "longrope"):
        assert resolve_factor(kind, "auto", 1024, 64) == 16.0
        assert resolve_factor(kind, "auto", 32, 64) == 1.0
    # llama3 at 1×: the trained model itself (left out), as pi, ntk and yarn
    assert eval_overrides(eval_cfg(rope_scaling={"kind": "llama3"}), ROTARY, 64, 64) == {}
    assert RopeScaling("llama3", 1.0, 64).is_identity()
    assert not RopeScaling("llama3", 1.0, 64).rescales_theta
    assert RopeScaling("yarn", 1.0, 64, ramp="reference").is_identity()
    # longrope at 1× still applies its short factors
    cfg = eval_cfg(rope_scaling={"kind": "longrope", **longrope_lists(8)})
    assert eval_overrides(cfg, ROTARY, 64, 64)["scaling"]["factor"] == 1.0


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_new_kinds_on_a_scheme_without_rotary_are_one_line_errors(kind):
    extra = longrope_lists(8) if kind == "longrope" else {}
    cfg = eval_cfg(rope_scaling={"kind": kind, **extra})
    for target in ("poslab.positions.alibi.ALiBi", "poslab.positions.t5.T5Bias"):
        with pytest.raises(ConfigError, match="act on rotary schemes") as err:
            eval_overrides(cfg, {"_target_": target}, 256, 64)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"eval.rope_scaling.kind={kind}")


@pytest.mark.parametrize(
    "scaling,match",
    [
        ({"kind": "selfextend", "group": 0}, "eval.rope_scaling.group=0 must be an integer"),
        ({"kind": "selfextend", "group": 1.5}, "eval.rope_scaling.group=1.5"),
        ({"kind": "lminfinite", "n_global": -1}, "eval.rope_scaling.n_global=-1"),
        ({"kind": "lminfinite", "window": 0}, "eval.rope_scaling.window=0"),
        ({"kind": "yarn", "ramp": "hf"}, "eval.rope_scaling.ramp=hf must be one of paper"),
        ({"kind": "yarn", "truncate": "yes"}, "eval.rope_scaling.truncate=yes"),
        ({"kind": "llama3", "low_freq_factor": 4, "high_freq_factor": 2}, "low_freq_factor=4"),
        ({"kind": "llama3", "high_freq_factor": 0}, "high_freq_factor=0"),
        ({"kind": "longrope"}, "set eval.rope_scaling.long_factor and short_factor=\\[...\\]"),
        ({"kind": "longrope", "long_factor": [1.0]}, "set eval.rope_scaling.short_factor="),
        (
            {"kind": "longrope", "long_factor": [1, 0], "short_factor": [1, 1]},
            "eval.rope_scaling.long_factor=\\[1,0\\] has 0",
        ),
        ({"kind": "longrope", "long_factor": 2, "short_factor": [1]}, "must be a list"),
    ],
)
def test_bad_options_of_the_new_kinds_are_one_line_errors(scaling, match):
    with pytest.raises(ConfigError, match=match) as err:
        eval_overrides(eval_cfg(rope_scaling=scaling), ROTARY, 256, 64)
    assert "\n" not in str(err.value)


def test_longrope_lists_of_the_wrong_length_are_one_line_errors():
    lists = {"long_factor": [1.0] * 3, "short_factor": [1.0] * 8}
    scaling = eval_overrides(eval_cfg(rope_scaling={"kind": "longrope", **lists}), ROTARY, 256, 64)
    with pytest.raises(ConfigError) as err:
        build_scheme("rope", 64, 4, **scaling)  # head_dim 16: R/2 = 8
    message = str(err.value)
    assert message.startswith("eval.rope_scaling.long_factor has 3 numbers")
    assert "R/2 = 8" in message and "\n" not in message
    four = {"long_factor": [1.0] * 4, "short_factor": [1.0] * 4}  # R = 8: four per list
    half = build_scheme("rope", 64, 4, fraction=0.5, scaling={**scaling["scaling"], **four})
    assert half.scaling.long_factor == (1.0,) * 4


def test_null_options_in_the_eval_config_mean_the_kind_defaults():
    """conf/eval/default.yaml lists the new options as null (old runs' configs lack them)."""
    cfg = eval_cfg(rope_scaling={"kind": "selfextend"})
    defaults = eval_cfg().rope_scaling
    for name in ("ramp", "truncate", "low_freq_factor", "high_freq_factor", "group", "n_global"):
        assert defaults[name] is None
    scaling = RopeScaling(**{**eval_variant_options(cfg), "factor": 1.0, "train_length": 64})
    assert (scaling.group, scaling.n_global, scaling.local_window()) == (4, 10, 16)
    assert (scaling.ramp, scaling.truncate) == ("paper", True)
    assert (scaling.low_freq_factor, scaling.high_freq_factor) == (1.0, 4.0)


# ---- end to end: eval.py's path on a trained rope checkpoint ----------------------------------


def test_new_kinds_evaluate_a_rope_checkpoint_at_16x(trained_runs):
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"  # model=tiny: head_dim 32
    plain = score_checkpoint(ckpt, eval_cfg(factors=[1, 16]))
    base = {r["length"]: r for r in plain}
    for scaling in [
        {"kind": "llama3"},
        {"kind": "longrope", **longrope_lists(16)},
        {"kind": "yarn", "ramp": "reference"},
        {"kind": "selfextend"},
        {"kind": "lminfinite", "n_global": 2},
        {"kind": "string"},
        {"kind": "string", "shift": 8, "local": 3, "temperature": False},
    ]:
        cfg = eval_cfg(factors=[1, 16], rope_scaling=scaling)
        rows = score_checkpoint(ckpt, cfg)
        by_length = {r["length"]: r for r in rows}
        assert all(r["status"] == "ok" and math.isfinite(r["ppl"]) for r in rows), scaling
        assert by_length[256]["ppl"] != base[256]["ppl"], scaling  # it acted at 16×
        assert rows[0]["scheme"].startswith(f"rope + {scaling['kind']}")
        if scaling["kind"] in ("llama3", "yarn"):  # left out at 1×: the trained model itself
            assert by_length[16]["ppl"] == base[16]["ppl"], scaling
        if scaling["kind"] == "lminfinite":  # the same function at 1×, by the blockwise kernel
            assert by_length[16]["ppl"] == pytest.approx(base[16]["ppl"], rel=1e-3)


@pytest.mark.parametrize("pairing,fraction", FEW_LAYOUTS)
@pytest.mark.parametrize("groups,window", [((1, 2, 4, 8), 8), ((3, 1), None), ((2,), 5)])
@pytest.mark.parametrize("offset", [0, 37])
def test_dpe_equals_the_references_formula(pairing, fraction, groups, window, offset):
    """LuLuLuyi/DPE, transcribed: near keys (m − n < w) plain; far keys in band b with the
    query at m // G_b + w − w / G_b and the key at n // G_b, the bands equal shares of the
    pairs, the fastest first."""
    train_length, length = 16, 48
    scaling = {"kind": "dpe", "train_length": train_length, "groups": list(groups)}
    scheme = build_scheme(
        "rope", 64, 4, pairing=pairing, fraction=fraction, scaling={**scaling, "window": window}
    )
    assert scheme.needs == "scores"
    w = window or train_length // 4
    positions = torch.arange(length) + offset
    q, k = torch.randn(2, 1, 4, length, 16, generator=torch.Generator().manual_seed(3))
    got = kernel_scores(scheme, positions, q, k)
    m, n = torch.tril_indices(length, length)
    near = ((m - n) < w)[:, None]
    pairs = scheme.rotary_dims // 2
    group = torch.tensor(groups, dtype=torch.float64).repeat_interleave(pairs // len(groups))
    qpos = torch.where(near, (m + offset)[:, None].double(), m[:, None] // group + w - w / group)
    kpos = torch.where(near, (n + offset)[:, None].double(), n[:, None] // group)
    theta, r = scheme.frequencies(), scheme.rotary_dims
    qr = rotate64(q[..., m, :], qpos, theta, scheme.pairing, r, per_pair=True)
    kr = rotate64(k[..., n, :], kpos, theta, scheme.pairing, r, per_pair=True)
    expected = (qr * kr).sum(-1) / math.sqrt(16)
    torch.testing.assert_close(got[..., m, n].double(), expected, atol=2e-5, rtol=1e-5)


def test_dpe_with_every_group_one_is_plain_rotary_and_a_bad_split_is_one_line():
    plain = build_scheme("rope", 64, 4)
    ones = build_scheme(
        "rope", 64, 4, scaling={"kind": "dpe", "train_length": 16, "groups": [1, 1]}
    )
    positions = torch.arange(40)
    q, k = torch.randn(2, 1, 4, 40, 16, generator=torch.Generator().manual_seed(4))
    prepared = plain.prepare(positions)
    q_in, k_in = plain.rotate(q, k, prepared)
    want = q_in @ k_in.transpose(-1, -2) / 4
    got = kernel_scores(ones, positions, q, k)
    lower = torch.ones(40, 40, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., lower], want[..., lower], atol=2e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="do not split into 3 equal bands"):
        build_scheme(
            "rope", 64, 4, scaling={"kind": "dpe", "train_length": 16, "groups": [1, 2, 4]}
        )


@pytest.mark.parametrize("pairing,fraction", LAYOUTS)
@pytest.mark.parametrize("temperature", [True, False])
def test_string_equals_its_formula_with_the_factor_on_the_rotated_dims_only(
    pairing, fraction, temperature
):
    """HKUNLP/STRING, transcribed (issue #60): near keys (m − n < S) plain, far keys with the
    query S − W closer; the rotated dims' cos/sin times 0.1·ln 2 + 1 (as YaRN's temperature and
    HF's partial rotary), the dims a fraction < 1 passes through left as trained."""
    train_length, length, shift, local = 16, 40, 9, 3
    scaling = {"kind": "string", "train_length": train_length, "shift": shift, "local": local}
    scheme = build_scheme(
        "rope",
        64,
        4,
        pairing=pairing,
        fraction=fraction,
        scaling={**scaling, "temperature": temperature},
    )
    positions = torch.arange(length)
    q, k = torch.randn(2, 1, 4, length, 16, generator=torch.Generator().manual_seed(5))
    got = kernel_scores(scheme, positions, q, k)
    m, n = torch.tril_indices(length, length)
    qpos = torch.where(m - n < shift, m, m - (shift - local))
    theta, r = scheme.frequencies(), scheme.rotary_dims
    factor = 0.1 * math.log(2) + 1 if temperature else 1.0
    qr, kr = (
        rotate64(q[..., m, :], qpos, theta, pairing, r),
        rotate64(k[..., n, :], n, theta, pairing, r),
    )
    rotated = (qr[..., :r] * kr[..., :r]).sum(-1) * factor**2
    passed = (qr[..., r:] * kr[..., r:]).sum(-1)  # none at fraction = 1
    expected = (rotated + passed) / math.sqrt(16)
    torch.testing.assert_close(got[..., m, n].double(), expected, atol=2e-5, rtol=1e-5)
