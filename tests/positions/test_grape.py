"""GRAPE-AP (positions/grape.py) against a float64 transcription of the reference's bias
(model-architectures/GRAPE, model/llama-mha-grape-ap-v1.py, lines 170–185: row total minus
prefix sum of α_h·log σ(⟨p_t, R_ℓ p̂_ℓ⟩/d)): values and gradients on every kernel its check
accepts, the path sum's properties, ALiBi as the case p = 0, its options' errors and a tiny run."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, Auto, Blockwise, Flex, StickBreaking
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import Linear
from poslab.positions.alibi import ALiBi, alibi_slopes
from poslab.positions.grape import GrapeAP

D_MODEL, N_HEAD, HEAD_DIM, T = 16, 2, 8, 9
EPS = torch.finfo(torch.float32).eps  # F.rms_norm's default for the reference's fp32 p


def reference_bias(p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) float64 bias of features p (B, H, T, d), keys at `positions` ((T,) or
    (B, T)), −inf above the diagonal: the reference's steps, written out."""
    p = p.double()
    d = p.shape[-1]
    unit = p / torch.sqrt(p.square().mean(-1, keepdim=True) + EPS)
    angle = positions.double()[..., None, :, None]  # rotary with base 1: every pair at ℓ rad
    x1, x2 = unit[..., : d // 2], unit[..., d // 2 :]
    turned = torch.cat(
        [x1 * angle.cos() + x2 * angle.sin(), -x1 * angle.sin() + x2 * angle.cos()], -1
    )
    slopes = torch.tensor(alibi_slopes(p.shape[1]), dtype=torch.float64)[:, None, None]
    edges = F.logsigmoid(p @ turned.transpose(-1, -2) / d) * slopes
    seen = torch.ones(p.shape[-2], p.shape[-2], dtype=torch.bool).tril()
    edges = edges.masked_fill(~seen, 0.0)
    bias = edges.sum(-1, keepdim=True) - edges.cumsum(-1)
    return bias.masked_fill(~seen, -math.inf)


def features64(scheme: GrapeAP, x: torch.Tensor, k: torch.Tensor, layer: int) -> torch.Tensor:
    """p (B, H, T, d): the reference's c_p(x) per head, or the key (tied, `pktie`)."""
    if scheme.projection is None:
        return k.double()
    weight = scheme.projection[layer].double()  # (H, p_dim, d_model)
    return torch.einsum("btd,hpd->bhtp", x.double(), weight)


def scheme(p_dim: int | None = 8, n_layer: int = 2, seed: int = 0, **options) -> GrapeAP:  # noqa: ANN003
    torch.manual_seed(seed)
    return GrapeAP(D_MODEL, N_HEAD, n_layer=n_layer, p_dim=p_dim, **options)


def future(tq: int, tk: int) -> torch.Tensor:
    return torch.arange(tk)[None, :] > torch.arange(tk - tq, tk)[:, None]


@pytest.mark.parametrize("p_dim", [8, 4, None])
@pytest.mark.parametrize("start", [0, 5])  # the whole matrix, and a block of the last queries
@pytest.mark.parametrize("per_sequence", [False, True])
def test_modify_scores_and_gradients_equal_the_reference(p_dim, start, per_sequence):
    pos = scheme(p_dim)
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(2, N_HEAD, T, HEAD_DIM, generator=gen, dtype=torch.float64) * 2
    x = torch.randn(2, T, D_MODEL, generator=gen, dtype=torch.float64) * 2
    k.requires_grad_(True), x.requires_grad_(True)
    scores = torch.randn(2, N_HEAD, T - start, T, generator=gen, dtype=torch.float64)
    positions = torch.arange(T) * 3 + 5  # not 0..T−1: the angles are the positions
    if per_sequence:
        positions = torch.stack([positions, torch.arange(T) + 40])
    fp32 = positions.float()
    mask = future(T - start, T)
    data = pos.layer_data(x, 1)
    ours = pos.modify_scores(scores, k[:, :, start:], k, mask, fp32[..., start:], fp32, 1, data)
    assert ours.dtype == torch.float32 and ours.shape == scores.shape
    theirs = scores + reference_bias(features64(pos, x, k, 1), positions)[:, :, start:]
    seen = ~mask.expand_as(ours)
    torch.testing.assert_close(ours.double()[seen], theirs[seen], rtol=1e-5, atol=1e-5)
    assert (ours.double() - scores)[seen].abs().max() > 0.1  # the bias is not vacuous
    weights = torch.randn(theirs.shape, generator=gen, dtype=torch.float64).masked_fill(~seen, 0)
    wrt = [x, pos.projection] if p_dim else [k]
    grads_ours = torch.autograd.grad((ours.double() * weights).sum(), wrt)
    grads_theirs = torch.autograd.grad((theirs.masked_fill(~seen, 0) * weights).sum(), wrt)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the model's attention layer, on every kernel


def model(kernel, p_dim: int | None = 8) -> GPT:  # noqa: ANN001
    config = GPTConfig(vocab_size=13, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    gpt = GPT(config, scheme(p_dim), kernel).double()
    with torch.no_grad():  # scores and keys large enough that the bias varies by query and key
        gpt.blocks[1].attn.qkv.weight.normal_(0, 0.5)
    return gpt


def reference_layer(gpt: GPT, x: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer `layer`'s attention output, transcribed in float64."""
    attn, pos = gpt.blocks[layer].attn, gpt.pos
    batch, seq_len, _ = x.shape
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = (
        t.reshape(batch, seq_len, N_HEAD, HEAD_DIM).transpose(1, 2)
        for t in qkv.split(D_MODEL, dim=-1)
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    scores = scores + reference_bias(features64(pos, x, k, layer), torch.arange(seq_len))
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq_len, D_MODEL)
    return y @ attn.proj.weight.T + attn.proj.bias


def layer_output(gpt: GPT, x: torch.Tensor, layer: int) -> torch.Tensor:
    prepared = gpt.pos.prepare(torch.arange(x.shape[1]))
    state = gpt.attention.begin(gpt.pos, prepared, x.dtype)
    return gpt.blocks[layer].attn(x, prepared, gpt.pos, gpt.attention, state, layer)


ACCEPTING = {
    "blockwise": lambda: Blockwise(),
    "blockwise in blocks": lambda: Blockwise(block_size=3),
    "auto": lambda: Auto(),  # picks blockwise for a scheme that needs the scores
}


@pytest.mark.parametrize("p_dim", [8, None])
@pytest.mark.parametrize("kernel", list(ACCEPTING))
def test_every_kernel_its_check_accepts_computes_the_reference_attention(kernel, p_dim):
    gpt = model(ACCEPTING[kernel](), p_dim)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=True)
    ours, theirs = layer_output(gpt, x, 1), reference_layer(gpt, x, 1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, check_dtype=False)
    wrt = [x, *gpt.blocks[1].attn.parameters(), *gpt.pos.parameters()]
    grads_ours = torch.autograd.grad(ours.square().sum(), wrt)
    grads_theirs = torch.autograd.grad(theirs.square().sum(), wrt)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, check_dtype=False)
    if p_dim:  # each layer its own projection: layer 1's gradient reaches only its own
        grad = grads_ours[-1]
        assert (grad[0] == 0).all() and grad[1].abs().max() > 0


@pytest.mark.parametrize("kernel", [SDPA, Flex, StickBreaking, Linear])
def test_kernels_without_the_scores_refuse_it_in_one_line(kernel):
    config = GPTConfig(vocab_size=13, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    with pytest.raises(ConfigError, match=r"cannot serve pos=GrapeAP") as err:
        GPT(config, scheme(), kernel())
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# properties of the path sum


def bias_of(
    pos: GrapeAP, k: torch.Tensor, positions: torch.Tensor, data: torch.Tensor | None = None
) -> torch.Tensor:
    """The bias alone (scores of 0), −inf above the diagonal."""
    mask = future(k.shape[-2], k.shape[-2])
    zero = torch.zeros(*k.shape[:2], k.shape[-2], k.shape[-2])
    out = pos.modify_scores(zero, k, k, mask, positions, positions, 0, data)
    return out.masked_fill(mask, -math.inf)


def test_the_bias_is_zero_on_the_diagonal_and_falls_along_the_path():
    pos = scheme(p_dim=None)  # p = k
    k = torch.randn(1, N_HEAD, 12, HEAD_DIM) * 3
    positions = torch.arange(12).float()
    bias = bias_of(pos, k, positions)[0]
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    rows, cols = torch.tril_indices(12, 12, offset=-1)
    steps = bias[:, rows, cols] - bias[:, rows, cols + 1]  # b(t, j) − b(t, j+1) = ψ(t, j+1)
    assert (steps < 0).all()  # log σ < 0: every edge costs, by an amount the content sets
    potentials = pos.edge_potentials(k, positions, 12)[0]
    torch.testing.assert_close(steps, potentials[:, rows, cols + 1])
    assert steps.std() > 0.05 * steps.abs().mean()  # not a constant slope: not ALiBi


def test_the_edges_depend_on_the_query_not_only_on_the_key():
    """What sets GRAPE-AP apart from FoX (edges from the key alone, b = c_t − c_j): the same
    edge ℓ costs differently for different queries t."""
    pos = scheme()
    p = pos.layer_data(torch.randn(1, 10, D_MODEL) * 6, 0).detach()
    potentials = pos.edge_potentials(p, torch.arange(10).float(), 10)[0]
    # edge ℓ = 2 seen from queries 2..9 (a column of ψ over the rows that see it)
    assert potentials[:, 2:, 2].std(dim=-1).min() > 1e-3


def test_p_zero_is_alibi_with_slopes_times_log_2():
    """Every edge log σ(0) = −log 2: the bias is −α_h·log 2·(t − j), ALiBi's with its slopes
    scaled by log 2, whatever the positions."""
    pos = scheme()
    with torch.no_grad():
        pos.projection.zero_()
    k = torch.randn(2, N_HEAD, 11, HEAD_DIM)
    positions = torch.arange(11).float() * 7 + 3
    bias = bias_of(pos, k, positions, pos.layer_data(torch.randn(2, 11, D_MODEL), 0))
    alibi = ALiBi(D_MODEL, N_HEAD).attention_bias(positions / 7, positions / 7) * math.log(2)
    seen = ~future(11, 11)
    torch.testing.assert_close(bias[..., seen], alibi.expand_as(bias)[..., seen])


def test_the_angle_is_the_keys_position_so_an_offset_shows():
    pos = scheme(p_dim=None)
    k = torch.randn(1, N_HEAD, 8, HEAD_DIM) * 3
    positions = torch.arange(8).float()
    seen = ~future(8, 8)
    base = bias_of(pos, k, positions)[..., seen]
    # 40 rad is no whole number of turns: every key's feature turns to another angle
    assert (bias_of(pos, k, positions + 40)[..., seen] - base).abs().max() > 1e-3
    assert not pos.shift_invariant and pos.reads_positions


def test_fp32_under_bf16_autocast():
    pos = scheme(p_dim=None)
    k = torch.randn(1, N_HEAD, 7, HEAD_DIM)
    positions = torch.arange(7).float() + 300  # above 256: bf16 positions would collide
    plain = bias_of(pos, k, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = bias_of(pos, k.bfloat16(), positions)
    assert under.dtype == torch.float32
    torch.testing.assert_close(under, bias_of(pos, k.bfloat16().float(), positions))
    assert torch.isfinite(plain[..., ~future(7, 7)]).all()


def test_masked_scores_make_no_nan():
    """The kernel may pass −inf for the keys a query may not see: they stay out of the bias."""
    pos = scheme(p_dim=None)
    k = torch.randn(1, N_HEAD, 6, HEAD_DIM)
    mask = future(6, 6)
    scores = torch.zeros(1, N_HEAD, 6, 6).masked_fill(mask, -math.inf)
    out = pos.modify_scores(scores, k, k, mask, torch.arange(6.0), torch.arange(6.0), 0)
    assert torch.isfinite(out[..., ~mask]).all()


# ---------------------------------------------------------------------------------------------
# parameters and options


def test_a_projection_per_layer_and_head_or_none_when_tied_to_the_key():
    pos = scheme(p_dim=8, n_layer=3)
    assert pos.projection.shape == (3, N_HEAD, 8, D_MODEL) and pos.per_layer
    big = GrapeAP(256, 4, n_layer=2)  # the reference's init: std 0.5/√d_model
    assert abs(big.projection.std().item() - 0.5 / 16) < 2e-3
    assert list(pos.state_dict()) == ["projection"]  # the slopes are rebuilt from the rule
    tied = scheme(p_dim=None)
    assert tied.projection is None and tied.state_dict() == {}
    torch.testing.assert_close(tied.slopes, torch.tensor(alibi_slopes(N_HEAD)))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"p_dim": 7}, "pos.p_dim=7 must be even"),
        ({"p_dim": 0}, "pos.p_dim=0 must be an integer ≥ 2 or null"),
        ({"p_dim": "eight"}, "pos.p_dim=eight must be an integer"),
        ({"p_dim": None, "d_model": 12, "n_head": 4}, "pos.p_dim=null takes the head dim 3"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, expected):
    sizes = {"d_model": options.pop("d_model", D_MODEL), "n_head": options.pop("n_head", N_HEAD)}
    with pytest.raises(ConfigError, match=re.escape(expected)) as err:
        GrapeAP(**sizes, **options)
    assert "\n" not in str(err.value)


def test_the_cli_trains_20_steps_and_scores_to_4x(corpus, tmp_path):
    from conftest import train_in_process

    train_in_process("grape", corpus, tmp_path / "run", ["trainer.max_steps=20"])
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert {r["length"] for r in rows if r["status"] == "ok"} == {16, 32, 64}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")
