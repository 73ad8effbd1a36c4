"""CABLE (positions/cable.py) against a float64 transcription of the reference code's formula
(AlgonetLabs/Cable, src/Cable.py, `CausalSelfAttention.forward`): per head a linear map of the
layer's normalised input, b = cumsum(−softplus(x W_h + b_h)) over the tokens, and the score
bias b_i − b_j added unscaled to the causal scores. Values and gradients, on every kernel its
`needs` accepts; then the properties the docstring promises."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, Auto, Blockwise, Flex, StickBreaking, flex_available
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import Linear
from poslab.positions import build_scheme
from poslab.positions.alibi import ALiBi
from poslab.positions.cable import Cable
from poslab.positions.fox import Forgetting

D_MODEL, N_HEAD = 8, 2


def reference_bias(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T): the reference's `Bias` without its causal mask, in float64, for the
    layer's input x (B, T, d), the projection's weight (H, d) and bias (H,)."""
    h = x.double() @ weight.double().T + bias.double()  # (B, T, H): `h_attn(x)`
    b = torch.cumsum(-F.softplus(h), dim=1).permute(0, 2, 1)  # (B, H, T)
    return b.unsqueeze(3) - b.unsqueeze(2)


def model(kernel, sinks: bool = False) -> GPT:  # noqa: ANN001
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=17, n_layer=1, n_head=N_HEAD, d_model=D_MODEL, sinks=sinks)
    pos = Cable(D_MODEL, N_HEAD, n_layer=1)
    with torch.no_grad():  # away from the init, so heads and tokens differ visibly
        pos.proj_weight.normal_(0, 0.7)
        pos.proj_bias.copy_(torch.tensor([[-1.0, 0.5]]))
    gpt = GPT(config, pos, kernel).double()
    with torch.no_grad():  # scores and outputs of order 1, not the near-zero of a std-0.02 init
        for p in gpt.blocks[0].attn.parameters():
            p.normal_(0, 0.5)
    if sinks:
        with torch.no_grad():
            gpt.blocks[0].attn.sinks.copy_(torch.tensor([0.7, -1.3], dtype=torch.float64))
    return gpt


def reference(gpt: GPT, x: torch.Tensor, stick_breaking: bool = False) -> torch.Tensor:
    """The attention layer's output for its (normalised) input x, transcribed in float64."""
    attn, pos = gpt.blocks[0].attn, gpt.pos
    batch, seq_len, d_model = x.shape
    head_dim = d_model // N_HEAD
    q, k, v = (
        t.view(batch, seq_len, N_HEAD, head_dim).transpose(1, 2)
        for t in (x @ attn.qkv.weight.T + attn.qkv.bias).split(d_model, dim=-1)
    )
    # the kernels scale q·k by 1/√head_dim (the reference: by 1); the bias goes in unscaled
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    scores = scores + reference_bias(x, pos.proj_weight[0], pos.proj_bias[0])
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    if stick_breaking:  # attention=stick_breaking's weights over the same scores
        z = scores.masked_fill(future, 0.0)
        log_rest = F.logsigmoid(-z).tril(-1)  # the keys before each query (not itself)
        after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest
        weights = (F.logsigmoid(z) + after).exp().tril(-1)
    elif attn.sinks is not None:  # gpt-oss: a sink column, dropped after the softmax
        scores = scores.masked_fill(future, -math.inf)
        column = attn.sinks.view(1, N_HEAD, 1, 1).expand(batch, N_HEAD, seq_len, 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    y = (weights @ v).transpose(1, 2).reshape(batch, seq_len, d_model)
    return y @ attn.proj.weight.T + attn.proj.bias


def layer_output(gpt: GPT, x: torch.Tensor) -> torch.Tensor:
    prepared = gpt.pos.prepare(torch.arange(x.shape[1]))
    state = gpt.attention.begin(gpt.pos, prepared, x.dtype)
    return gpt.blocks[0].attn(x, prepared, gpt.pos, gpt.attention, state, 0)


KERNELS = {
    "sdpa": lambda: SDPA(),  # a decay alone: −c_j as one more key dimension
    "sdpa with sinks": lambda: SDPA(block_size=3, full_bias_mib=0),  # the decay as a bias
    "blockwise": lambda: Blockwise(),
    "blockwise in blocks": lambda: Blockwise(block_size=3),
    "auto": lambda: Auto(),
    "stick_breaking": lambda: StickBreaking(),
}


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_values_and_gradients_equal_the_reference_formula(kernel):
    gpt = model(KERNELS[kernel](), sinks=kernel == "sdpa with sinks")
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64, requires_grad=True)
    ours = layer_output(gpt, x)
    theirs = reference(gpt, x, stick_breaking=kernel == "stick_breaking")
    # c is fp32 by design (and the decay kernel and blockwise compute in fp32)
    tolerance = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(ours, theirs, **tolerance, check_dtype=False)
    weights = torch.randn_like(theirs)
    wrt = [x, gpt.pos.proj_weight, gpt.pos.proj_bias, *gpt.blocks[0].attn.parameters()]
    grads_ours = torch.autograd.grad((ours * weights).sum(), wrt)
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), wrt)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, **tolerance, check_dtype=False)
    assert grads_ours[1].abs().sum() > 0 and grads_ours[2].abs().sum() > 0


@pytest.mark.skipif(not flex_available(), reason="FlexAttention needs torch ≥ 2.5")
@torch.no_grad()  # FlexAttention has no backward on a CPU
def test_flex_computes_the_reference_attention():
    gpt = model(Flex())
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    ours = layer_output(gpt, x)
    torch.testing.assert_close(ours, reference(gpt, x), rtol=1e-5, atol=1e-5, check_dtype=False)


def test_linear_attention_refuses_it_in_one_line():
    config = GPTConfig(vocab_size=17, n_layer=1, n_head=N_HEAD, d_model=D_MODEL)
    with pytest.raises(ConfigError):
        GPT(config, Cable(D_MODEL, N_HEAD, n_layer=1), Linear())


def test_the_bias_sums_the_tokens_penalties_between_query_and_key():
    """c_i − c_j = −Σ_{k=j+1..i} softplus(w·x_k + b): 0 on the diagonal, negative before it,
    falling with every token further back."""
    torch.manual_seed(1)
    pos = Cable(D_MODEL, N_HEAD, n_layer=1)
    x = torch.randn(1, 7, D_MODEL)
    with torch.no_grad():
        c = pos.data_decay(x, 0).double()
        penalty = F.softplus(x.double() @ pos.proj_weight[0].double().T + pos.proj_bias[0])
    for i, j in [(6, 0), (4, 2), (3, 3)]:
        expected = -penalty[0, j + 1 : i + 1].sum(0)  # per head
        torch.testing.assert_close(c[0, :, i] - c[0, :, j], expected, atol=1e-5, rtol=0)
    bias = c[..., :, None] - c[..., None, :]
    lower = torch.ones(7, 7, dtype=torch.bool).tril(-1)
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all() and (bias[..., lower] < 0).all()
    assert (bias.diff(dim=-1)[..., lower[:, :-1]] > 0).all()  # a nearer key: a higher bias


def test_the_bias_of_a_pair_reads_only_the_tokens_after_the_key_up_to_the_query():
    """Context-aware: what lies between key j and query i sets their bias; what comes before
    the key or after the query does not."""
    torch.manual_seed(2)
    pos = Cable(D_MODEL, N_HEAD, n_layer=1)
    x = torch.randn(1, 9, D_MODEL)
    i, j = 6, 2
    with torch.no_grad():
        before = pos.data_decay(x, 0)
        for t, changes in [(0, False), (j, False), (j + 1, True), (i, True), (i + 1, False)]:
            other = x.clone()
            other[:, t] += 3.0
            after = pos.data_decay(other, 0)
            moved = (after[..., i] - after[..., j] - before[..., i] + before[..., j]).abs()
            assert bool((moved > 1e-4).any()) == changes, t


def test_it_starts_as_alibi_with_slope_log_2_and_the_projection_of_the_reference():
    torch.manual_seed(3)
    pos = build_scheme("cable", d_model=256, n_head=4, n_layer=3)
    assert pos.proj_weight.shape == (3, 4, 256) and pos.proj_bias.shape == (3, 4)
    assert (pos.proj_bias == 0).all() and abs(pos.proj_weight.std().item() - 0.02) < 2e-3
    assert pos.per_layer and pos.needs == "decay" and not pos.reads_positions
    with torch.no_grad():  # a zero input: every token costs softplus(0) = log 2
        c = pos.data_decay(torch.zeros(1, 5, 256), 2)
    expected = -math.log(2) * torch.arange(1, 6, dtype=torch.float32).expand(1, 4, 5)
    torch.testing.assert_close(c, expected)


def test_a_penalty_the_same_for_every_token_is_alibi():
    """w = 0: the bias is −softplus(b_h) · (i − j), ALiBi with slopes softplus(b)."""
    pos = Cable(D_MODEL, 4, n_layer=1, bias_init=1.5)
    alibi = ALiBi(D_MODEL, 4)
    with torch.no_grad():
        pos.proj_weight.zero_()
        pos.proj_bias.copy_(torch.tensor([[-2.0, -0.5, 0.0, 1.5]]))
        alibi.slopes.copy_(F.softplus(pos.proj_bias[0]))
        c = pos.data_decay(torch.randn(2, 11, D_MODEL), 0)
    positions = torch.arange(11)
    lower = torch.ones(11, 11, dtype=torch.bool).tril()
    ours = (c[..., :, None] - c[..., None, :])[..., lower]
    theirs = alibi.attention_bias(positions, positions)[..., lower].expand_as(ours)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_it_is_fox_with_the_gates_sign_flipped():
    """−softplus(z) = log σ(−z): FoX's c with weight −w and bias −b."""
    torch.manual_seed(4)
    pos = Cable(D_MODEL, N_HEAD, n_layer=2)
    fox = Forgetting(D_MODEL, N_HEAD, n_layer=2)
    with torch.no_grad():
        pos.proj_weight.normal_(0, 0.5)
        fox.gate_weight.copy_(-pos.proj_weight)
        fox.gate_bias.copy_(-pos.proj_bias)
        x = torch.randn(2, 9, D_MODEL)
        for layer in range(2):
            torch.testing.assert_close(pos.data_decay(x, layer), fox.data_decay(x, layer))


def test_each_layer_has_its_own_projection_and_learns_it():
    torch.manual_seed(5)
    pos = Cable(16, N_HEAD, n_layer=2)
    gpt = GPT(GPTConfig(vocab_size=23, n_layer=2, n_head=N_HEAD, d_model=16), pos)
    idx = torch.randint(0, 23, (2, 12))
    gpt.loss(idx[:, :-1], idx[:, 1:]).backward()
    for layer in range(2):
        assert pos.proj_weight.grad[layer].abs().sum() > 0
        assert pos.proj_bias.grad[layer].abs().sum() > 0
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        assert not torch.allclose(pos.data_decay(x, 0), pos.data_decay(x, 1))


def test_the_bias_stays_fp32_under_bf16_autocast():
    pos = Cable(32, N_HEAD, n_layer=1)
    x = torch.randn(1, 300, 32).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = pos.data_decay(x, 0)
    assert c.dtype == torch.float32
    # a bf16 running sum of 300 penalties near log 2 would be off by about 1
    torch.testing.assert_close(c, pos.data_decay(x.float(), 0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("value", ["big", float("nan"), True, None])
def test_a_bad_bias_init_is_one_line(value):
    with pytest.raises(ConfigError, match=re.escape("pos.bias_init=")) as error:
        build_scheme("cable", d_model=D_MODEL, n_head=N_HEAD, bias_init=value)
    assert "\n" not in str(error.value)


def test_the_cli_trains_20_steps_and_scores_to_4x(corpus, tmp_path):
    """`train.py pos=cable` trains, and its evaluation after training scores 1–4 × L."""
    from conftest import train_in_process

    train_in_process("cable", corpus, tmp_path / "run", ["trainer.max_steps=20"])
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    scored = {r["length"] for r in rows if r["status"] == "ok"}
    assert scored == {16, 32, 64}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")
