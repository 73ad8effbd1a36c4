"""PoPE (positions/pope.py) against a float64 transcription of the paper's score,
Σ_c softplus(q_c) softplus(k_c) cos((t − s) θ_c − δ_c) / √d, θ_c = base^(−c/d), δ ∈ [−2π, 0]:
values and gradients, on every kernel its check accepts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, Auto, Blockwise, Flex, StickBreaking
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import Linear
from poslab.positions.pope import PolarPositions


def paper_scores(q, k, phase, base, positions):  # noqa: ANN001, ANN201
    """(B, H, T, T) scaled scores from the paper's formula, in float64."""
    d = q.shape[-1]
    theta = base ** -(torch.arange(d, dtype=torch.float64) / d)
    mu_q, mu_k = F.softplus(q.double()), F.softplus(k.double())
    delta = phase.double().clamp(-2 * math.pi, 0)[None, :, None, None, :]  # (1, H, 1, 1, d)
    distance = (positions[:, None] - positions[None, :]).double()[..., None] * theta  # (T, T, d)
    terms = mu_q[:, :, :, None] * mu_k[:, :, None] * torch.cos(distance - delta)
    return terms.sum(-1) / math.sqrt(d)


def scheme(n_head: int = 2, d_model: int = 16, **options) -> PolarPositions:  # noqa: ANN003
    pos = PolarPositions(d_model, n_head, n_layer=2, **options)
    with torch.no_grad():  # phases away from 0, some beyond the clamp
        pos.phase.uniform_(-7.0, 0.5)
    return pos


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_scores_and_gradients_equal_the_papers_formula(base):
    torch.manual_seed(0)
    pos = scheme(base=base)
    q = torch.randn(2, 2, 9, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(9) + 5
    q2, k2 = pos.rotate(q, k, positions, layer=1)
    assert q2.shape[-1] == k2.shape[-1] == 16  # real and imaginary parts
    ours = q2 @ k2.transpose(-1, -2) / math.sqrt(q2.shape[-1])  # as the kernels scale
    theirs = paper_scores(q, k, pos.phase[1], base, positions)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(theirs)
    grads_ours = torch.autograd.grad((ours * weights).sum(), [q, k, pos.phase])
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), [q, k, pos.phase])
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


def test_phases_start_at_zero_and_the_clamp_stops_their_gradient():
    pos = PolarPositions(16, 2, n_layer=2)
    assert pos.phase.shape == (2, 2, 8) and (pos.phase == 0).all()
    shared = PolarPositions(16, 2, n_layer=2, per_layer=False)
    assert shared.phase.shape == (1, 2, 8)
    with torch.no_grad():
        pos.phase.fill_(-9.0)  # below −2π: clamped, no gradient while it stays there
    q = k = torch.randn(1, 2, 4, 8)
    _, k2 = pos.rotate(q, k, torch.arange(4))
    (grad,) = torch.autograd.grad(k2.sum(), [pos.phase])
    assert (grad == 0).all()


def test_magnitudes_are_what_and_phases_where():
    """A query and key of equal content at distance 0 score Σ μ² cos(δ)/√d whatever the
    position; the content changes only the magnitudes (never negative)."""
    pos = PolarPositions(16, 2)
    x = torch.randn(1, 2, 1, 8)
    scores = []
    for p in (0, 17, 1000):
        q2, k2 = pos.rotate(x, x, torch.tensor([p]))
        scores.append((q2 * k2).sum(-1) / 4)
    expected = F.softplus(x).square().sum(-1) / math.sqrt(8)
    for s in scores:
        torch.testing.assert_close(s, expected)


KERNELS = {
    "sdpa": SDPA,
    "blockwise": Blockwise,
    "auto": Auto,
    "flex": Flex,
    "stick_breaking": StickBreaking,
}


@pytest.mark.parametrize("kernel", list(KERNELS))
@torch.no_grad()  # FlexAttention has no backward on a CPU
def test_every_kernel_its_check_accepts_computes_the_papers_attention(kernel):
    torch.manual_seed(1)
    config = GPTConfig(vocab_size=13, n_layer=1, n_head=2, d_model=16)
    pos = scheme()
    gpt = GPT(config, pos, KERNELS[kernel]()).eval()
    x = torch.randn(1, 7, 16)
    attn = gpt.blocks[0].attn
    q, k, v = attn.qkv(x).split(16, dim=2)
    q, k, v = (t.view(1, 7, 2, 8).transpose(1, 2) for t in (q, k, v))
    positions = torch.arange(7)
    prepared = pos.prepare(positions)
    q2, k2 = pos.rotate(q, k, prepared, 0)
    out = gpt.attention(
        q2, k2, v, pos, prepared, gpt.attention.begin(pos, prepared, x.dtype), 0, 0.0
    )
    scores = paper_scores(q, k, pos.phase[0], 10000.0, positions)
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
    if kernel == "stick_breaking":  # its own weights over the same scores
        z = scores.masked_fill(torch.isinf(scores), 0)
        log_rest = F.logsigmoid(-z).tril(-1)
        after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest
        weights = (F.logsigmoid(z) + after).exp().tril(-1)
    else:
        weights = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(out.double(), weights @ v.double(), rtol=1e-4, atol=1e-5)


def test_linear_attention_refuses_it_in_one_line():
    config = GPTConfig(vocab_size=13, n_layer=1, n_head=2, d_model=16)
    with pytest.raises(ConfigError, match="attention=linear cannot serve pos=PolarPositions"):
        GPT(config, scheme(), Linear())


def test_the_cli_trains_20_steps_and_scores_to_4x(corpus, tmp_path):
    import json

    from conftest import train_in_process

    train_in_process("pope", corpus, tmp_path / "run", ["trainer.max_steps=20"])
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert {r["length"] for r in rows if r["status"] == "ok"} == {16, 32, 64}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")


@pytest.mark.parametrize("kernel", ["sdpa", "blockwise"])
def test_sinks_and_the_gate_combine_with_it(kernel):
    """PoPE's keys are twice as wide as the values: the sink's zero key and zero value each
    take their own width."""
    config = GPTConfig(vocab_size=13, n_layer=1, n_head=2, d_model=16, gate="headwise", sinks=True)
    gpt = GPT(config, scheme(), KERNELS[kernel]())
    logits = gpt(torch.randint(0, 13, (2, 9)))
    assert logits.shape == (2, 9, 13) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert gpt.blocks[0].attn.sinks.grad is not None
