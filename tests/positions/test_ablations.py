"""The ablation switches of the rotary scheme: how a learnable θ is parameterised
(pos.theta_param), and the mixed-precision position bug reproduced on purpose
(pos.position_dtype=bf16) against the fp32 default."""

from __future__ import annotations

import pytest
import torch

from poslab.positions import build_scheme
from poslab.positions.rope import rope_theta

D_MODEL, N_HEAD = 64, 4


def one_adam_step(scheme: torch.nn.Module, lr: float) -> torch.Tensor:
    """θ after one Adam step on a loss that depends on every frequency."""
    q, k = torch.randn(
        2, 1, N_HEAD, 32, D_MODEL // N_HEAD, generator=torch.Generator().manual_seed(0)
    )
    params = [p for p in scheme.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    q_rot, k_rot = scheme.rotate(q, k, torch.arange(32))
    (q_rot @ k_rot.transpose(-1, -2)).square().mean().backward()
    optimizer.step()
    return scheme.frequencies().detach()


def test_raw_theta_moves_by_the_learning_rate_and_log_theta_by_a_relative_step():
    lr = 1e-3
    init = rope_theta(D_MODEL // N_HEAD, 10000.0)
    raw = one_adam_step(build_scheme("rope", D_MODEL, N_HEAD, learnable_theta=True), lr)
    # Adam's first step is lr·sign(grad) for every parameter: the same absolute move for all θ_i,
    # a relative move of lr/θ_i, about 1000× lr for the lowest frequency (θ ≈ 1e-3 here)
    assert torch.allclose((raw - init).abs(), torch.full_like(init, lr), rtol=1e-3)
    assert ((raw - init).abs() / init).max() > 100 * lr
    log = build_scheme("rope", D_MODEL, N_HEAD, learnable_theta=True, theta_param="log")
    assert [n for n, _ in log.named_parameters()] == ["log_theta"]
    assert torch.allclose(log.frequencies(), init, rtol=1e-6)
    moved = one_adam_step(log, lr)
    relative = (moved - init).abs() / init  # every θ_i moves by the same factor e^(±lr)
    assert torch.allclose(relative, torch.full_like(init, lr), rtol=2e-3)
    assert set(log.metrics()) == {"theta_rel_change_mean", "theta_rel_change_max"}


def test_a_fixed_theta_has_no_parameter_and_reports_nothing():
    scheme = build_scheme("rope", D_MODEL, N_HEAD, theta_param="log")  # log without learning
    assert list(scheme.parameters()) == [] and scheme.metrics() == {}


def test_default_positions_and_angles_are_distinct_up_to_16k_under_bf16_autocast():
    scheme = build_scheme("rope", D_MODEL, N_HEAD)
    positions = torch.arange(16384)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = scheme.prepare(positions)
        angles = scheme.angles(prepared.fp32)
    assert prepared.fp32.dtype == angles.dtype == torch.float32
    assert torch.equal(prepared.fp32, positions.float())  # every integer exact
    assert (angles.diff(dim=0) > 0).all()  # every frequency: a new angle at every position


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_bf16_positions_collide_above_256_as_in_the_bug(name):
    scheme = build_scheme(name, D_MODEL, N_HEAD, position_dtype="bf16")
    positions = torch.arange(8192)
    values = scheme.prepare(positions).fp32
    assert torch.equal(values[:257], positions[:257].float())  # exact up to 256
    distinct = values.unique().numel() / 8192
    # 8 significant bits: 128 values per octave above 256, so ~10% of 0..8191 stay distinct
    assert 0.09 < distinct < 0.12
    if name == "rope":
        angles = scheme.angles(values)
        assert angles.unique(dim=0).shape[0] < 0.12 * 8192
    else:
        bias = scheme.attention_bias(positions[-1:], positions)  # the last query's view
        assert bias[0, 0].unique().numel() < 0.12 * 8192  # far keys share their distance
