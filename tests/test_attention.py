"""poslab/model/attention.py: causal attention with a bias against the naive formula, the kernels'
options and the pairings they refuse (what every kernel computes for every scheme is in
tests/positions/test_properties.py)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, Auto, Blockwise, Flex, causal_attention
from poslab.model.gpt import GPT, GPTConfig
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
