"""Eval-time RoPE context extension (positions/rope_scaling.py): every kind against its formula
on hand-computed values, the equivalences the papers state, and the evaluation path end to end."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import eval_cfg, score_checkpoint, train_in_process

from poslab.errors import ConfigError
from poslab.positions import build_scheme, scheme_configs
from poslab.positions.rope import rope_theta
from poslab.positions.rope_scaling import RopeScaling, eval_overrides, resolve_factor

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
