"""PaTH attention (positions/path_attn.py) against two independent float64 transcriptions: the
paper's definition, s(i, j) = q_iᵀ H_i ⋯ H_{j+1} k_j with H_t = I − β_t w_t w_tᵀ, the product
taken one transform at a time; and the reference's decoding rule (fla/layers/path_attn.py:
when token t arrives every cached key becomes H_t k, then the query reads the cache). Values
and gradients, on every kernel its `check` accepts; the layer's w and β against the reference
layer's formula; then the properties the docstring promises, and the fla kernel on a GPU."""

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
from poslab.positions import build_scheme
from poslab.positions.path_attn import PaTH, fla_kernel, path_scores

D_MODEL, N_HEAD, HEAD_DIM, T = 16, 2, 8, 11


def householder(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """H = I − β w wᵀ, (…, d, d) in float64."""
    eye = torch.eye(w.shape[-1], dtype=torch.float64)
    return (
        eye - beta.double()[..., None, None] * w.double()[..., :, None] * w.double()[..., None, :]
    )


def definition_scores(q, k, w, beta) -> torch.Tensor:  # noqa: ANN001
    """(B, H, Tq, Tk) float64, queries the last Tq of the Tk tokens; 0 after each query."""
    transforms = householder(w, beta)  # (B, H, Tk, d, d)
    tq, tk = q.shape[-2], k.shape[-2]
    out = torch.zeros(*q.shape[:2], tq, tk, dtype=torch.float64)
    for r in range(tq):
        t = tk - tq + r
        row = q[..., r, :].double()  # q_tᵀ, then times H_t, H_{t−1}, … as j moves back
        for j in range(t, -1, -1):
            out[..., r, j] = (row * k[..., j, :].double()).sum(-1)
            row = (row[..., None, :] @ transforms[..., j, :, :])[..., 0, :]
    return out


def decoding_scores(q, k, w, beta) -> torch.Tensor:  # noqa: ANN001
    """All T queries over all T keys by the reference's decoding rule, float64."""
    transforms = householder(w, beta)
    cache, rows = [], []
    for t in range(k.shape[-2]):
        cache = [(transforms[..., t, :, :] @ key[..., None])[..., 0] for key in cache]
        cache.append(k[..., t, :].double())
        seen = torch.stack([(q[..., t, :].double() * key).sum(-1) for key in cache], dim=-1)
        rows.append(F.pad(seen, (0, k.shape[-2] - t - 1)))
    return torch.stack(rows, dim=-2)


def inputs(tq: int = T, tk: int = T, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, N_HEAD, tq, HEAD_DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(2, N_HEAD, tk, HEAD_DIM, generator=gen, dtype=torch.float64)
    w = F.normalize(
        torch.randn(2, N_HEAD, tk, HEAD_DIM, generator=gen, dtype=torch.float64), dim=-1
    )
    beta = 2 * torch.rand(2, N_HEAD, tk, generator=gen, dtype=torch.float64)
    return [t.requires_grad_(True) for t in (q, k, w, beta)]


@pytest.mark.parametrize(("queries", "chunk"), [(T, 4), (T, 64), (T, 1), (5, 3), (1, 4), (7, 11)])
def test_the_chunked_scores_and_gradients_equal_the_definition(queries, chunk):
    q, k, w, beta = inputs(queries)
    ours, theirs = path_scores(q, k, w, beta, chunk), definition_scores(q, k, w, beta)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(theirs)
    grads_ours = torch.autograd.grad((ours * weights).sum(), (q, k, w, beta))
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), (q, k, w, beta))
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_the_definition_equals_the_reference_decoding_rule():
    q, k, w, beta = inputs()
    torch.testing.assert_close(definition_scores(q, k, w, beta), decoding_scores(q, k, w, beta))


# ---------------------------------------------------------------------------------------------
# the layer: w and β from x, and the attention on every kernel


def reference_layer_data(pos: PaTH, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, ...]:
    """The reference layer's w and β, float64: w_proj (two Linears), ShortConvolution (causal,
    depthwise, SiLU), l2_norm per head; β = 2σ(bt_proj(x))."""
    x = x.double()
    h = x @ pos.w_down[layer].double().T @ pos.w_up[layer].double().T
    taps = pos.w_conv[layer].double()  # (d_model, K): output t reads inputs t − K + 1 .. t
    size = taps.shape[-1]
    padded = F.pad(h, (0, 0, size - 1, 0))
    conv = sum(padded[:, i : i + x.shape[1]] * taps[:, i] for i in range(size))
    w = F.silu(conv).view(*x.shape[:2], N_HEAD, HEAD_DIM).transpose(1, 2)
    w = w / torch.sqrt(w.square().sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(x @ pos.beta_weight[layer].double().T + pos.beta_bias[layer].double())
    return w, beta.transpose(1, 2)


def model(kernel, **options) -> GPT:  # noqa: ANN001, ANN003
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=13, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    gpt = GPT(config, PaTH(D_MODEL, N_HEAD, n_layer=2, chunk_size=4, **options), kernel)
    gpt = gpt.double()
    with torch.no_grad():  # away from the std-0.02 start, so that the transforms differ visibly
        for p in [*gpt.pos.parameters(), *gpt.blocks[1].attn.parameters()]:
            p.normal_(0, 0.5)
    return gpt


def reference_layer(gpt: GPT, x: torch.Tensor, layer: int) -> torch.Tensor:
    attn = gpt.blocks[layer].attn
    batch, seq_len, _ = x.shape
    q, k, v = (
        t.reshape(batch, seq_len, N_HEAD, HEAD_DIM).transpose(1, 2)
        for t in (x @ attn.qkv.weight.T + attn.qkv.bias).split(D_MODEL, dim=-1)
    )
    w, beta = reference_layer_data(gpt.pos, x, layer)
    scores = definition_scores(q, k, w, beta) / math.sqrt(HEAD_DIM)
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    y = (weights @ v).transpose(1, 2).reshape(batch, seq_len, D_MODEL)
    return y @ attn.proj.weight.T + attn.proj.bias


def layer_output(gpt: GPT, x: torch.Tensor, layer: int) -> torch.Tensor:
    prepared = gpt.pos.prepare(torch.arange(x.shape[1]))
    state = gpt.attention.begin(gpt.pos, prepared, x.dtype)
    return gpt.blocks[layer].attn(x, prepared, gpt.pos, gpt.attention, state, layer)


def test_w_and_beta_equal_the_reference_layer():
    pos = model(Blockwise()).pos
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    for ours, theirs in zip(pos.layer_data(x, 1), reference_layer_data(pos, x, 1), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, check_dtype=False)
    w, beta = pos.layer_data(x, 1)
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(2, N_HEAD, T), atol=1e-5, rtol=0)
    assert ((beta > 0) & (beta < 2)).all() and beta.dtype == w.dtype == torch.float32


ACCEPTING = {
    "blockwise": lambda: Blockwise(),
    "blockwise in blocks": lambda: Blockwise(block_size=3),  # blocks not aligned with chunks
    "auto": lambda: Auto(),  # picks blockwise for a scheme that needs the scores
}


def assert_near(ours: torch.Tensor, theirs: torch.Tensor, relative: float) -> None:
    """‖ours − theirs‖ ≤ relative · ‖theirs‖: fp32 against float64, for tensors whose entries
    span orders of magnitude (a gradient of thousands beside one near 0)."""
    error = (ours.double() - theirs.double()).norm() / theirs.double().norm().clamp(min=1e-30)
    assert error <= relative, float(error)


@pytest.mark.parametrize("kernel", list(ACCEPTING))
def test_every_kernel_its_check_accepts_computes_the_reference_attention(kernel):
    gpt = model(ACCEPTING[kernel]())
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=True)
    ours, theirs = layer_output(gpt, x, 1), reference_layer(gpt, x, 1)
    # fp32 by design (the scores and the chunks' triangular solves): measured 3e-7 and 7e-6
    assert_near(ours, theirs, 1e-5)
    wrt = [x, *gpt.blocks[1].attn.parameters(), *gpt.pos.parameters()]
    grads_ours = torch.autograd.grad(ours.square().sum(), wrt)
    grads_theirs = torch.autograd.grad(theirs.square().sum(), wrt)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        assert_near(a, b, 1e-4)
    for grad in grads_ours[-5:]:  # each layer its own parameters: layer 1's reach only its own
        assert (grad[0] == 0).all() and grad[1].abs().max() > 0


@pytest.mark.parametrize("kernel", [SDPA, Flex, StickBreaking, Linear])
def test_kernels_without_the_scores_refuse_it_in_one_line(kernel):
    config = GPTConfig(vocab_size=13, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    with pytest.raises(ConfigError, match=r"cannot serve pos=PaTH") as err:
        GPT(config, PaTH(D_MODEL, N_HEAD, n_layer=2), kernel())
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# properties


def test_beta_zero_is_nope():
    q, k, w, beta = (t.detach() for t in inputs())
    scores = path_scores(q, k, w, torch.zeros_like(beta), 4)
    torch.testing.assert_close(scores, (q @ k.transpose(-1, -2)).tril())


def test_only_the_transforms_between_key_and_query_count():
    """s(i, j) reads H_{j+1} … H_i: changing w or β at j or before, or after i, changes
    nothing; changing it in between does."""
    q, k, w, beta = (t.detach() for t in inputs())
    i, j = 8, 3
    base = path_scores(q, k, w, beta, 4)[..., i, j]
    for t, moves in [(0, False), (j, False), (j + 1, True), (i, True), (i + 1, False)]:
        other = beta.clone()
        other[..., t] = 2 - other[..., t]
        changed = (path_scores(q, k, w, other, 4)[..., i, j] - base).abs().max() > 1e-9
        assert bool(changed) == moves, t


def test_the_sign_of_w_and_the_positions_change_nothing():
    q, k, w, beta = (t.detach() for t in inputs())
    # w → −w: H = I − β w wᵀ is the same transform
    torch.testing.assert_close(path_scores(q, k, -w, beta, 4), path_scores(q, k, w, beta, 4))
    gpt = model(Blockwise())
    idx = torch.randint(0, 13, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(gpt(idx, torch.arange(T) + 1000), gpt(idx))
    assert gpt.pos.shift_invariant and not gpt.pos.reads_positions


def test_causal_a_later_token_changes_no_earlier_output():
    gpt = model(Blockwise(block_size=4))
    idx = torch.randint(0, 13, (1, T))
    with torch.no_grad():
        base = gpt(idx)
        idx[0, 7] = (idx[0, 7] + 1) % 13
        after = gpt(idx)
    torch.testing.assert_close(after[:, :7], base[:, :7])
    assert (after[:, 7:] - base[:, 7:]).abs().max() > 1e-6


def test_fp32_under_bf16_autocast_and_no_nan_at_16x():
    pos = build_scheme("path_attn", d_model=64, n_head=4, n_layer=1)
    gpt = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=4, d_model=64), pos, Auto())
    x = torch.randn(1, 300, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w, beta = pos.layer_data(x.bfloat16(), 0)
        logits = gpt(torch.randint(0, 50, (1, 512)))
    assert w.dtype == beta.dtype == torch.float32 and torch.isfinite(logits).all()


def test_the_starting_weights_are_the_references():
    pos = build_scheme("path_attn", d_model=256, n_head=4, n_layer=3)
    assert pos.w_down.shape == (3, 32, 256) and pos.w_up.shape == (3, 256, 32)
    assert pos.w_conv.shape == (3, 256, 3) and pos.beta_weight.shape == (3, 4, 256)
    assert (pos.beta_bias == 0).all() and abs(pos.w_up.std().item() - 0.02) < 2e-3
    full = PaTH(256, 4, rank=None, conv_size=None)
    assert full.w_down is None and full.w_conv is None and full.w_up.shape == (1, 256, 256)
    x = torch.randn(1, 5, 256)
    w, _ = full.layer_data(x, 0)
    expected = (x @ full.w_up[0].T).view(1, 5, 4, 64).transpose(1, 2)
    torch.testing.assert_close(w, F.normalize(expected, dim=-1, eps=1e-3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"rank": 0}, "pos.rank=0 must be an integer ≥ 1 or null"),
        ({"conv_size": "three"}, "pos.conv_size=three must be an integer"),
        ({"chunk_size": None}, "pos.chunk_size=null must be an integer ≥ 1"),
        ({"randomize_max": 512}, "reads no positions"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)) as err:
        PaTH(D_MODEL, N_HEAD, **options)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(
    not torch.cuda.is_available() or fla_kernel() is None, reason="needs a GPU with fla"
)
def test_fla_kernel_on_a_gpu_equals_the_chunked_path():
    """On a GPU with fla, the blockwise kernel hands a plain layer to fla's fused kernel
    (`attend`); its output and gradients equal the chunked path's (`Blockwise.weights`, which
    never asks `attend`), in fp32."""
    torch.manual_seed(0)
    pos = PaTH(256, 4, n_layer=1).cuda()
    x = torch.randn(2, 300, 256, device="cuda")
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", requires_grad=True) for _ in range(3))
    data = pos.layer_data(x, 0)
    assert pos.attend(q, k, v, data, 0) is not None  # fla is there and takes these shapes
    prepared = pos.prepare(torch.arange(300, device="cuda"))
    fused = Blockwise()(q, k, v, pos, prepared, None, 0, 0.0, data=data)
    chunked = Blockwise().weights(q, k, pos, prepared, 0, 0, 300, data=data) @ v
    torch.testing.assert_close(fused, chunked, rtol=2e-3, atol=2e-3)
    wrt = [q, k, v, *pos.parameters()]
    grad = torch.randn_like(fused)
    theirs = torch.autograd.grad(chunked, wrt, grad, retain_graph=True)  # w, β are shared
    for a, b in zip(torch.autograd.grad(fused, wrt, grad), theirs, strict=True):
        assert_near(a, b, 1e-3)


def test_the_cli_trains_20_steps_and_scores_to_4x(corpus, tmp_path):
    from conftest import train_in_process

    train_in_process("path_attn", corpus, tmp_path / "run", ["trainer.max_steps=20"])
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert {r["length"] for r in rows if r["status"] == "ok"} == {16, 32, 64}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")
