"""poslab/model/attention.py: causal attention with a bias against the naive formula, the kernels'
options and the pairings they refuse (what every kernel computes for every scheme is in
tests/positions/test_properties.py)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from models import N_HEAD, build_kernel, build_scheme, tiny_gpt, tokens
from torch import nn

from poslab.errors import ConfigError
from poslab.model.attention import (
    SDPA,
    Auto,
    Blockwise,
    Flex,
    StickBreaking,
    causal_attention,
    decay_attention,
    flex_available,
    sdpa,
)
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import Linear
from poslab.positions.alibi import ALiBi
from poslab.positions.cope import CoPE
from poslab.positions.nope import NoPositions
from poslab.positions.t5 import T5Bias, t5_bucket


@pytest.mark.parametrize("kernel", [SDPA, Auto])
@pytest.mark.parametrize("value", [-1, "abc", float("nan"), True])
def test_full_bias_mib_must_be_a_size(kernel, value):
    with pytest.raises(ConfigError, match=re.escape("attention.full_bias_mib=")):
        kernel(full_bias_mib=value)


def test_full_bias_mib_takes_zero_and_fractions_of_a_mib():
    assert SDPA(full_bias_mib=0).full_bias_bytes == 0  # always per block of queries
    assert SDPA(full_bias_mib=0.5).full_bias_bytes == 2**19


def _naive_attention(q, k, v, bias: torch.Tensor | None) -> torch.Tensor:
    """softmax(QK^T/sqrt(d) + bias + causal mask) V in float64; bias (H, T, T) or None."""
    q, k, v = q.double(), k.double(), v.double()
    seq_len, dim = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
    if bias is not None:
        scores = scores + bias.double()[None]
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _table_bias_fn(n_head: int, n_positions: int) -> Callable:
    table = torch.randn(n_head, n_positions, n_positions)

    def bias_fn(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        return table[:, q_positions][:, :, k_positions]

    return bias_fn


@pytest.mark.parametrize("block_size", [1, 4, 13, 1024])
@pytest.mark.parametrize("bias_kind", ["table", "alibi", "t5"])
def test_causal_attention_with_bias_matches_naive_reference(bias_kind, block_size):
    torch.manual_seed(10)
    batch, n_head, seq_len, dim = 2, 3, 13, 8
    q = torch.randn(batch, n_head, seq_len, dim)
    k = torch.randn(batch, n_head, seq_len, dim)
    v = torch.randn(batch, n_head, seq_len, dim)
    if bias_kind == "table":
        # arbitrary (even non-monotone) positions: causality is by index, bias by position
        positions = torch.randint(0, 40, (seq_len,))
        bias_fn = _table_bias_fn(n_head, 40)
    elif bias_kind == "alibi":
        positions = torch.arange(seq_len) + 100
        bias_fn = ALiBi(24, n_head).attention_bias
    else:
        positions = torch.arange(seq_len) * 3
        scheme = T5Bias(24, n_head, num_buckets=8, max_distance=20)
        nn.init.normal_(scheme.bias)
        bias_fn = scheme.attention_bias
    with torch.no_grad():
        out = causal_attention(q, k, v, positions, bias_fn=bias_fn, block_size=block_size)
        full_bias = bias_fn(positions, positions)
    assert out.shape == q.shape
    ref = _naive_attention(q, k, v, full_bias)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    # the bias mattered: without it the answer is different
    assert not torch.allclose(ref, _naive_attention(q, k, v, None), atol=1e-3)


def test_causal_attention_without_bias_matches_naive_reference():
    torch.manual_seed(11)
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    out = causal_attention(q, k, v, torch.arange(10))
    torch.testing.assert_close(out.double(), _naive_attention(q, k, v, None), atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_bf16_training_attention_runs_in_fp32_and_matches_the_fp32_formula(with_bias):
    """A bf16 call that needs gradients on a CPU runs SDPA in fp32 (faster there, and more
    exact): its output is the fp32 formula rounded once to bf16, its gradients reach q, k, v."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 12, 8).bfloat16().requires_grad_() for _ in range(3))
    bias = torch.randn(1, 3, 12, 12).masked_fill(torch.ones(12, 12).triu(1).bool(), -math.inf)
    options = {"attn_mask": bias.bfloat16()} if with_bias else {"is_causal": True}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, **options)
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        ref = _naive_attention(q, k, v, bias[0].bfloat16() if with_bias else None)
    # fp32 inside: one bf16 rounding of the output away from the exact answer, no more
    assert (out.double() - ref).abs().max() <= 2**-8 * ref.abs().max()
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))
    # without gradients (evaluation) the bf16 kernel serves: same formula within bf16
    with torch.no_grad():
        plain = sdpa(q.detach(), k.detach(), v.detach(), **options)
    torch.testing.assert_close(plain.double(), ref, atol=3e-2, rtol=0)


def test_t5_bias_fn_reference_is_independent_of_scheme_internals():
    # sanity check for the t5 bias of test_causal_attention_with_bias_matches_naive_reference:
    # its bias is table[bucket(q - k)] per head
    scheme = T5Bias(24, 3, num_buckets=8, max_distance=20)
    nn.init.normal_(scheme.bias)
    positions = torch.arange(6) * 3
    bias = scheme.attention_bias(positions, positions)
    for i in range(6):
        for j in range(6):
            bucket = int(t5_bucket(positions[i] - positions[j], 8, 20))
            assert torch.equal(bias[:, i, j], scheme.bias[0][bucket].detach())


def test_flex_kernel_rejects_attention_dropout():
    with pytest.raises(ConfigError, match="attention=flex has no attention dropout"):
        GPT(GPTConfig(vocab_size=50, dropout=0.1), NoPositions(256, 4), Flex())


def test_a_kernel_that_cannot_serve_a_scheme_is_one_clear_error():
    config = GPTConfig(vocab_size=41, n_layer=2, n_head=4, d_model=32)
    for kernel in (SDPA(), Flex()):
        with pytest.raises(ConfigError, match="needs the scores.*use attention=auto or"):
            GPT(config, CoPE(32, 4), kernel)
    GPT(config, CoPE(32, 4), Blockwise())  # the kernel that serves it


def test_compiled_flex_has_room_for_every_evaluation_length():
    """dynamic=False compiles one FlexAttention per shape; past dynamo's recompile limit (8) the
    kernel would run eagerly and materialise every score, so an evaluation over many lengths
    must not reach it."""
    from poslab.model.attention import _compiled_flex_attention

    _compiled_flex_attention()  # on a CPU nothing compiles until it is called on CUDA
    dynamo = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    assert getattr(dynamo, limit) >= 64


# ---- merged from test_attention_current.py ----
# The kernels and hooks of the 2024–25 methods: sliding windows, stick-breaking attention,
# FoX's data-dependent decay, a scheme per layer, and absolute positions concatenated to the
# tokens. Each against a float64 formula or a public reference (x-transformers for FoX's gates,
# fla-org's naive stick-breaking for the kernel); the generic properties (causality, m − n) are
# in tests/positions/test_properties.py, which covers the new schemes and kernels by itself.
D = 8  # head dim of the hand-made q, k, v


def _qkv(batch: int = 2, heads: int = 3, seq_len: int = 11, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, seq_len, D, generator=gen, dtype=torch.float64) for _ in "qkv"
    )


def _reference(q, k, v, bias=None, window=None):
    """Softmax attention in float64 with an optional (…, T, T) bias and sliding window."""
    seq_len = q.shape[-2]
    i = torch.arange(seq_len)
    hidden = i[None, :] > i[:, None]
    if window is not None:
        hidden |= i[:, None] - i[None, :] >= window
    scores = q @ k.transpose(-1, -2) / D**0.5
    if bias is not None:
        scores = scores + bias
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v


class _Plain:
    """A scheme stand-in with no positional work: what the kernels ask of a scheme."""

    needs, per_layer, n_head, n_layer, position_axes = "nothing", False, 3, 4, 0

    def layer_needs(self, layer):
        return self.needs

    def layer_index(self, layer):
        return 0


class _Prepared:
    def __init__(self, seq_len):
        self.fp32 = torch.arange(seq_len, dtype=torch.float32)


# -- sliding window -----------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 7, 11, 40])
@pytest.mark.parametrize(
    ("kernel", "options"),
    [("sdpa", {}), ("sdpa", {"block_size": 4, "full_bias_mib": 0}), ("blockwise", {})]
    + [("blockwise", {"block_size": 3}), ("auto", {})],
)
def test_a_sliding_window_sees_exactly_the_last_window_keys(kernel, options, window):
    q, k, v = _qkv()
    kernel = build_kernel(kernel, **options, window=window)
    pos, prepared = _Plain(), _Prepared(q.shape[-2])
    kernel.check(pos, 0.0)
    out = kernel(q, k, v, pos, prepared, kernel.begin(pos, prepared, q.dtype), 0, 0.0)
    torch.testing.assert_close(out, _reference(q, k, v, window=window), atol=1e-6, rtol=0)


def test_a_window_per_layer_applies_to_its_layer_only():
    q, k, v = _qkv()
    kernel = build_kernel("sdpa", window=[2, None, 5, None])
    pos, prepared = _Plain(), _Prepared(q.shape[-2])
    kernel.check(pos, 0.0)
    for layer, window in enumerate([2, None, 5, None]):
        out = kernel(q, k, v, pos, prepared, kernel.begin(pos, prepared, q.dtype), layer, 0.0)
        torch.testing.assert_close(out, _reference(q, k, v, window=window), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scheme", ["alibi", "t5", "fox"])
def test_a_window_is_the_same_on_every_kernel_with_a_bias_or_a_decay(scheme):
    """sdpa (shared bias, per-block bias), blockwise and flex agree on a windowed model."""
    idx = tokens(2, 21)
    kernels = [("sdpa", {}), ("sdpa", {"block_size": 4, "full_bias_mib": 0}), ("blockwise", {})]
    kernels += [("flex", {})] if flex_available() else []
    logits = []
    for kernel, options in kernels:
        model = tiny_gpt(scheme, kernel, kernel_options={**options, "window": 5})
        with torch.no_grad():
            logits.append(model(idx))
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], atol=2e-5, rtol=0)
    full = tiny_gpt(scheme, "sdpa")
    with torch.no_grad():
        assert (full(idx)[:, 5:] - logits[0][:, 5:]).abs().max() > 1e-3  # the window acts
        torch.testing.assert_close(full(idx)[:, :5], logits[0][:, :5], atol=2e-5, rtol=0)


WINDOWED_KERNELS = ["sdpa", "blockwise", "stick_breaking"] + (["flex"] if flex_available() else [])


@pytest.mark.parametrize("kernel", WINDOWED_KERNELS)
def test_rnope_swa_is_causal_and_its_global_layer_reads_beyond_the_window(kernel):
    """A windowed rope layer under a global nope layer (RNoPE-SWA, 1.00 to 8x in a needle seed): no
    logit reads a later token, and a token further back than the window still reaches the last
    logit (through the global layer), so the window hides nothing it should not either."""
    model = tiny_gpt(
        "schedule", kernel, kernel_options={"window": [3, None]}, layers=["rope", "nope"]
    )
    seq_len, gen = 16, torch.Generator().manual_seed(3)
    idx = tokens(2, seq_len)
    with torch.no_grad():
        logits = model(idx)
        for t in (0, 5, seq_len - 2):
            changed = idx.clone()
            changed[:, t + 1 :] = (idx[:, t + 1 :] + 1) % model.config.vocab_size
            new = model(changed)
            torch.testing.assert_close(new[:, : t + 1], logits[:, : t + 1], atol=1e-5, rtol=0)
            assert (new[:, t + 1 :] - logits[:, t + 1 :]).abs().max() > 1e-4
        far = idx.clone()
        far[:, 2] = (
            idx[:, 2] + torch.randint(1, 50, (2,), generator=gen)
        ) % model.config.vocab_size
        assert (model(far)[:, -1] - logits[:, -1]).abs().max() > 1e-4  # 13 back, window 3


@pytest.mark.parametrize(
    ("window", "says"),
    [
        (0, "attention.window"),
        (-3, "attention.window"),
        ("wide", "attention.window"),
        ([], "one window per layer"),
        ([4, 0], "attention.window"),
    ],
)
def test_a_bad_window_is_one_line(window, says):
    with pytest.raises(ConfigError, match=says):
        SDPA(window=window)


def test_a_window_list_of_the_wrong_length_is_one_line():
    with pytest.raises(ConfigError, match="3 entries for a model of 2 layers"):
        tiny_gpt("rope", "sdpa", kernel_options={"window": [4, None, 4]})


def test_linear_attention_takes_no_window():
    with pytest.raises(TypeError, match="window"):
        Linear(window=4)


# -- stick-breaking -----------------------------------------------------------------------------


def _naive_stick_breaking(q, k, v, attend_current):
    """fla-org/flash-linear-attention fla/ops/stickbreaking_attn/naive.py (read 2026-11), in
    float64, heads first: A_ij = σ(z_ij) Π_{j<l<i} (1 − σ(z_il)), the product over visible keys."""
    z = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    i = torch.arange(q.shape[-2])
    mask = i[None, :] <= i[:, None] if attend_current else i[None, :] < i[:, None]
    log_om_beta = F.logsigmoid(-z).masked_fill(~mask, 0.0)
    log_att = F.logsigmoid(z) + log_om_beta.flip(-1).cumsum(-1).flip(-1) - log_om_beta
    return log_att.masked_fill(~mask, float("-inf")).exp() @ v


def _explicit_stick_breaking(q, k, v, attend_current):
    """The paper's product written out with loops: an independent second reference."""
    z = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    beta = torch.sigmoid(z)
    weights = torch.zeros_like(z)
    for i in range(z.shape[-1]):
        last = i if attend_current else i - 1
        rest = torch.ones_like(z[..., i, 0])
        for j in range(last, -1, -1):  # the nearest key breaks the stick first
            weights[..., i, j] = beta[..., i, j] * rest
            rest = rest * (1 - beta[..., i, j])
    return weights @ v


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("block_size", [1, 4, 512])
def test_stick_breaking_equals_the_reference_formula(attend_current, block_size):
    q, k, v = _qkv(seq_len=13)
    q, k = 3 * q, 3 * k  # saturated sigmoids too
    kernel = StickBreaking(block_size=block_size, attend_current=attend_current)
    out = kernel(q, k, v, _Plain(), _Prepared(13), None, 0, 0.0)
    torch.testing.assert_close(
        out, _naive_stick_breaking(q, k, v, attend_current), atol=5e-6, rtol=0
    )
    torch.testing.assert_close(
        out, _explicit_stick_breaking(q, k, v, attend_current), atol=5e-6, rtol=0
    )


def test_stick_breaking_weights_sum_to_at_most_one_and_fall_to_nothing_without_keys():
    q, k, v = _qkv(seq_len=9)
    kernel = StickBreaking()
    weights = kernel.weights(q, k, _Plain(), _Prepared(9), 0, 0, 9)
    assert (weights.sum(-1) <= 1 + 1e-9).all()
    assert (weights[..., 0, :] == 0).all()  # the first query sees no key (attend_current=false)
    out = kernel(q, k, v, _Plain(), _Prepared(9), None, 0, 0.0)
    assert (out[..., 0, :] == 0).all()


def test_stick_breaking_trains_a_model_and_is_labelled_in_tables():
    model = tiny_gpt("nope", "stick_breaking")
    model.train()
    idx = tokens(2, 16)
    loss = model.loss(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.blocks.parameters())
    assert StickBreaking.row_label({}) == "stick-breaking"
    assert StickBreaking.row_label({"window": 64}) == "stick-breaking, window 64"
    assert build_kernel("sdpa").row_label({"window": [8, None]}) == "window 8/global"


def test_stick_breaking_with_a_window_and_a_decay_equals_the_product_written_out():
    """A window hides the keys W or more tokens back (and the stick they would break); a decay
    (FoX) adds c_i − c_j to the logits before the sigmoid."""
    q, k, v = _qkv(seq_len=12)
    decay = torch.randn(2, 3, 12, dtype=torch.float64).cumsum(-1)
    kernel = StickBreaking(block_size=5, attend_current=True, window=4)
    out = kernel(q, k, v, _Plain(), _Prepared(12), None, 0, 0.0, decay)
    z = q @ k.transpose(-1, -2) / D**0.5 + decay[..., :, None] - decay[..., None, :]
    beta = torch.sigmoid(z)
    weights = torch.zeros_like(z)
    for i in range(12):
        rest = torch.ones_like(z[..., i, 0])
        for j in range(i, max(-1, i - 4), -1):  # keys i, i−1, …, i−3: the last 4
            weights[..., i, j] = beta[..., i, j] * rest
            rest = rest * (1 - beta[..., i, j])
    torch.testing.assert_close(out, weights @ v, atol=5e-6, rtol=0)
    with pytest.raises(ConfigError, match="no key to attend to"):
        StickBreaking(window=1).check(_Plain(), 0.0)


def test_stick_breaking_refuses_a_scheme_that_needs_the_scores():
    with pytest.raises(ConfigError, match="stick_breaking cannot serve"):
        tiny_gpt("cope", "stick_breaking")


# -- FoX ----------------------------------------------------------------------------------------


def test_fox_bias_equals_x_transformers_data_dependent_alibi():
    from x_transformers.x_transformers import DataDependentAlibi

    torch.manual_seed(0)
    d_model, seq_len = 32, 10
    fox = build_scheme("fox", n_layer=1)
    reference = DataDependentAlibi(d_model, N_HEAD)
    with torch.no_grad():
        fox.gate_weight.normal_(0, 0.5)
        fox.gate_bias.normal_(0, 1)
        linear = reference.to_forget_gates[0]
        linear.weight.copy_(fox.gate_weight[0])
        linear.bias.copy_(fox.gate_bias[0])
        x = torch.randn(2, seq_len, d_model)
        c = fox.data_decay(x, 0)
        ours = c[..., :, None] - c[..., None, :]
        theirs = reference(x)
    lower = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    torch.testing.assert_close(ours[..., lower], theirs[..., lower], atol=1e-5, rtol=1e-5)


def test_fox_bias_is_the_sum_of_log_forget_gates_between_the_tokens():
    fox = build_scheme("fox", n_layer=1)
    x = torch.randn(1, 7, 32, dtype=torch.float32)
    with torch.no_grad():
        c = fox.data_decay(x, 0).double()
        gates = torch.sigmoid(x.double() @ fox.gate_weight[0].double().T + fox.gate_bias[0])
    for i, j in [(6, 0), (4, 2), (3, 3)]:
        expected = torch.log(gates[0, j + 1 : i + 1]).sum(0)  # Σ_{k=j+1..i} log f_k per head
        torch.testing.assert_close(c[0, :, i] - c[0, :, j], expected, atol=1e-5, rtol=0)


def test_fox_starts_with_gates_near_one_and_learns_them():
    torch.manual_seed(0)
    fox = build_scheme("fox")
    assert (fox.gate_bias == 5.0).all() and fox.gate_weight.shape == (2, N_HEAD, 32)
    model = GPT(GPTConfig(vocab_size=41, n_layer=2, n_head=N_HEAD, d_model=32), fox)
    idx = tokens(2, 12)
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert all(fox.gate_weight.grad[layer].abs().sum() > 0 for layer in range(2))


def test_fox_in_some_layers_of_a_schedule_gives_every_parameter_a_gradient():
    """DDP (find_unused_parameters=false) needs a gradient for every parameter: FoX's gates of
    the layers a schedule gives to another scheme get zeros, not None."""
    torch.manual_seed(0)
    pos = build_scheme("schedule", n_layer=4, layers=["alibi", "fox"])
    model = GPT(GPTConfig(vocab_size=41, n_layer=4, n_head=N_HEAD, d_model=32), pos)
    idx = tokens(2, 12)
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert all(p.grad is not None for p in model.parameters())
    gates = pos.members["fox"].gate_weight.grad
    assert (gates[0] == 0).all() and (gates[1] != 0).any()  # layer 0 is alibi's, layer 1 fox's


def test_fox_gates_stay_fp32_under_bf16_autocast():
    fox = build_scheme("fox", n_layer=1)
    x = torch.randn(1, 300, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = fox.data_decay(x.bfloat16(), 0)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c, fox.data_decay(x.bfloat16().float(), 0), atol=1e-5, rtol=1e-5)


class _Decay(_Plain):
    needs = "decay"


def _decay_inputs(length: int = 40, forget: float = 1.0, seed: int = 0):
    """fp32 q, k, v (B, H, T, D) and a decay c (B, H, T) as FoX makes it: a running sum of log
    gates, here of size up to `forget` per token (|c| reaches about forget·T/2)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, length, D, generator=gen) for _ in "qkv")
    decay = (-torch.rand(2, 3, length, generator=gen) * forget).cumsum(-1)
    return q, k, v, decay


def _decay_formula(q, k, v, decay):
    c = decay.double()
    return _reference(q.double(), k.double(), v.double(), bias=c[..., :, None] - c[..., None, :])


def _sdpa_with_decay(q, k, v, decay, dropout_p=0.0):
    kernel = build_kernel("sdpa")
    pos = _Decay()
    kernel.check(pos, dropout_p)
    return kernel(q, k, v, pos, _Prepared(q.shape[-2]), None, 0, dropout_p, decay)


@pytest.mark.parametrize("forget", [0.01, 1.0, 10.0])
def test_a_decay_on_sdpa_equals_the_formula_with_its_gradients(forget):
    """sdpa takes a decay alone (FoX) as an extra key dimension, −c_j: the same attention as
    the bias c_i − c_j, forward and backward, to fp32 rounding of scores of size |c|."""
    q, k, v, decay = (t.requires_grad_() for t in _decay_inputs(forget=forget))
    out = _sdpa_with_decay(q, k, v, decay)
    want = _decay_formula(q, k, v, decay)
    # fp32 scores carry c_j whole: their rounding grows with |c| (the bias path's, with c_i − c_j)
    atol = 1e-5 + 2e-7 * float(decay.abs().max())
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=0)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v, decay))
    expected = torch.autograd.grad((want * weights.double()).sum(), (q, k, v, decay))
    for g, e in zip(got, expected, strict=True):
        scale = max(1.0, float(e.abs().max()))
        torch.testing.assert_close(g.double(), e.double(), atol=atol * scale, rtol=0)


def test_a_decay_on_sdpa_runs_the_fused_kernel_in_fp32_under_bf16_autocast():
    """The (T, T) bias with a gradient sent sdpa to the math kernel, in bf16 with the bias
    rounded to bf16 (|c_i − c_j|/512). Now the fused kernel runs in fp32: the result equals the
    formula on the bf16-rounded q, k, v to fp32 rounding, which a bf16 bias could not."""
    from torch.profiler import profile

    q, k, v, decay = _decay_inputs(forget=1.0)
    q16, k16, v16 = (t.bfloat16() for t in (q, k, v))
    with profile() as prof, torch.autocast("cpu", dtype=torch.bfloat16):
        out = _sdpa_with_decay(q16, k16, v16, decay)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" not in ops
    assert out.dtype == torch.bfloat16  # what sdpa gives autocast's next matmul
    with torch.autocast("cpu", dtype=torch.bfloat16):
        exact = decay_attention(q16, k16, v16, decay)
    assert exact.dtype == torch.float32
    want = _decay_formula(q16, k16, v16, decay)
    torch.testing.assert_close(exact.double(), want, atol=1e-5, rtol=0)
    rounded_bias = (decay[..., :, None] - decay[..., None, :]).bfloat16().double()
    coarse = _reference(q16.double(), k16.double(), v16.double(), bias=rounded_bias)
    assert (coarse - want).abs().max() > 1e-3  # what the bf16 bias did: 100× the bound above


def test_a_decay_with_dropout_or_a_window_keeps_the_bias():
    """Dropout sends a CPU's sdpa to the math kernel, which would hold −c_j in the scores'
    dtype, and a window needs a mask: both keep the (T, T) bias, whose result is unchanged."""
    q, k, v, decay = _decay_inputs()
    torch.manual_seed(0)
    with_dropout = _sdpa_with_decay(q, k, v, decay, dropout_p=0.5)
    assert with_dropout.shape == q.shape and torch.isfinite(with_dropout).all()
    kernel = build_kernel("sdpa", window=5)
    kernel.check(_Decay(), 0.0)
    windowed = kernel(q, k, v, _Decay(), _Prepared(q.shape[-2]), None, 0, 0.0, decay)
    c = decay.double()
    bias = c[..., :, None] - c[..., None, :]
    want = _reference(q.double(), k.double(), v.double(), bias=bias, window=5)
    torch.testing.assert_close(windowed.double(), want, atol=1e-5, rtol=0)


# -- a scheme per layer -------------------------------------------------------------------------


def test_a_schedule_gives_each_layer_its_scheme():
    """Layer by layer, a schedule's model computes what a model of that layer's scheme does:
    the same weights in a model of rope alone and one of nope alone give the schedule's layers."""
    schedule = tiny_gpt("schedule", "blockwise", layers=["rope", "nope"])
    assert [schedule.pos.layer_needs(i) for i in range(2)] == ["nothing", "nothing"]
    assert type(schedule.pos.member(0)).__name__ == "Rotary"
    assert type(schedule.pos.member(1)).__name__ == "NoPositions"
    q, k = torch.randn(2, 1, N_HEAD, 6, 8)
    rq, rk = schedule.pos.rotate(q, k, torch.arange(6), layer=0)
    nq, nk = schedule.pos.rotate(q, k, torch.arange(6), layer=1)
    assert not torch.equal(rq, q) and torch.equal(nq, q) and torch.equal(nk, k)
    rope = build_scheme("rope")
    eq, ek = rope.rotate(q, k, torch.arange(6))
    torch.testing.assert_close(rq, eq)
    torch.testing.assert_close(rk, ek)


def test_a_schedule_of_bias_and_decay_schemes_matches_across_kernels():
    idx = tokens(2, 14)
    outs = []
    for kernel in ("sdpa", "blockwise"):
        model = tiny_gpt("schedule", kernel, layers=["alibi", "fox"])
        assert model.pos.needs == "bias"
        with torch.no_grad():
            outs.append(model(idx))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=0)


@pytest.mark.skipif(not flex_available(), reason="needs FlexAttention (torch >= 2.5)")
@pytest.mark.parametrize(
    ("scheme", "options", "dense"),
    [
        ("alibi", {"learnable_slopes": True}, False),
        ("t5", {"per_layer": True}, False),
        ("kerple", {"variant": "power"}, False),
        ("sandwich", {}, False),
        ("fire", {}, True),
        ("schedule", {"layers": ["t5", "fire"]}, False),
    ],
)
def test_flex_reads_every_learnable_bias_in_a_form_it_can_differentiate(scheme, options, dense):
    """Compiled FlexAttention's backward (CUDA) takes a captured tensor's gradient only where the
    score_mod indexes it once, directly; the first GPU run failed to compile T5's table, which
    was selected by layer inside the score_mod. Each scheme now prepares its learnable tensors
    outside (flex_score_bias) or, with none such form (FIRE's MLP), hands the dense table of its
    attention_bias: the same logits as the reference kernel here (eager, forward), and the same
    gradients on a GPU (tests/test_cuda.py)."""
    pos = build_scheme(scheme, d_model=64, **options)
    assert (pos.flex_score_bias(0) is None) == dense
    idx = tokens(2, 40)
    outs = []
    for kernel in ("blockwise", "flex"):
        model = tiny_gpt(scheme, kernel, d_model=64, **options)
        with torch.no_grad():
            outs.append(model(idx))
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-5)


def test_a_schedule_repeats_its_pattern_and_shares_a_scheme_between_layers():
    pos = build_scheme("schedule", n_layer=6, layers=["rope", "rope", "nope"])
    assert [type(pos.member(i)).__name__ for i in range(6)] == [
        "Rotary",
        "Rotary",
        "NoPositions",
    ] * 2
    assert len(pos.members) == 2
    pos = build_scheme("schedule", layers=["rope"], options={"rope": {"base": 500000.0}})
    assert pos.member(0).base == 500000.0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"layers": ["rope", "nope", "rope"]}, "3 entries for a model of 2 layers"),
        ({"layers": ["rope", "yarn"]}, "no scheme 'yarn'"),
        ({"layers": ["learned", "rope"]}, "token embeddings"),
        ({"layers": ["schedule"]}, "no scheme 'schedule'"),
        ({"layers": "rope"}, "give a list"),
        ({"layers": []}, "give a list"),
        ({"layers": ["rope"], "options": {"rope": {"bas": 3}}}, "no option 'bas'"),
    ],
)
def test_a_bad_schedule_is_one_line(options, says):
    with pytest.raises(ConfigError, match=says):
        build_scheme("schedule", **options)


# -- absolute positions concatenated ------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal"])
def test_concatenated_positions_take_the_last_dims_and_leave_the_tokens_alone(scheme):
    pos = build_scheme(scheme, combine="concat", position_dims=12)
    x = torch.randn(2, 9, 32)
    out = pos.embed(x, torch.arange(9))
    assert torch.equal(out[..., :20], x[..., :20])
    added = build_scheme(scheme, combine="add")
    assert pos.joining.width == 12 and added.joining.width == 32
    assert pos.joining.label() == "concat 12 dims"
    if scheme == "sinusoidal":  # the encoding of 12 dims, as the formula says
        from poslab.positions.sinusoidal import sinusoidal_table

        torch.testing.assert_close(out[0, :, 20:], sinusoidal_table(torch.arange(9), 12))
    else:
        torch.testing.assert_close(out[0, :, 20:], pos.table.weight[:9])
    assert build_scheme(scheme, combine="concat").joining.width == 8  # d_model / 4


def test_table_rows_state_the_width_split_the_kernel_and_the_window():
    from poslab.evaluation.plan import scheme_label

    model = {"d_model": 64}
    concat = {"pos_name": "learned", "pos": {"combine": "concat", "position_dims": None}}
    assert scheme_label({**concat, "model": model}) == "learned concatenated (16 of 64 dims)"
    sized = {"pos_name": "sinusoidal", "pos": {"combine": "concat", "position_dims": 8}}
    assert scheme_label({**sized, "model": model}) == "sinusoidal concatenated (8 of 64 dims)"
    added = {"pos_name": "learned", "pos": {"combine": "add"}, "model": model}
    assert scheme_label(added) == "learned"
    stick = {"_target_": "poslab.model.attention.StickBreaking", "window": None}
    assert (
        scheme_label({"pos_name": "nope", "pos": {}, "attention": stick}) == "nope, stick-breaking"
    )
    swa = {"_target_": "poslab.model.attention.Auto", "window": [32, 32, 32, None]}
    schedule = {"pos_name": "schedule", "pos": {"layers": ["rope", "rope", "rope", "nope"]}}
    label = scheme_label({**schedule, "attention": swa})
    assert label == "schedule rope/rope/rope/nope, window 32/32/32/global"


def test_fox_checkpoints_with_a_linear_per_layer_still_load():
    fox = build_scheme("fox")
    old = {
        f"pos.gates.{i}.{kind}": torch.randn(*shape)
        for i in range(2)
        for kind, shape in (("weight", (N_HEAD, 32)), ("bias", (N_HEAD,)))
    }
    state = fox.upgrade_state(old)
    assert set(state) == {"pos.gate_weight", "pos.gate_bias"}
    assert torch.equal(state["pos.gate_weight"][1], old["pos.gates.1.weight"])
    assert torch.equal(state["pos.gate_bias"][0], old["pos.gates.0.bias"])
