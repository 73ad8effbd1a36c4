"""Causal attention kernels (`model.attention`).

* ``sdpa`` (default), no score bias (nope, learned, sinusoidal, rope): one
  `scaled_dot_product_attention` call with `is_causal=True`, which dispatches to flash /
  memory-efficient kernels on CUDA and to the fused flash kernel on CPU, so memory grows linearly
  with the length.
* ``sdpa`` with a score bias (alibi, t5, ...): the bias is built once per forward (`CausalBias`)
  and shared by every layer when the whole (H, T, T) matrix is small (training lengths);
  otherwise queries are processed in blocks of `block_size`, each block seeing only the keys up
  to its last query and getting its bias built for that block alone. Memory is then
  O(block_size · T) per head instead of O(T²), so 16× the training length fits on a CPU; a block
  as long as the sequence is exactly the full-matrix path.
* ``flex``: FlexAttention (torch ≥ 2.5) with the scheme's `score_bias` as `score_mod` and a causal
  block mask: the bias is computed inside the fused kernel and never stored. Compiled on CUDA
  (its purpose); on a CPU it runs eagerly, for tests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.errors import ConfigError

KERNELS = ("sdpa", "flex")
BiasFn = Callable[[Tensor, Tensor], Tensor]  # (q_positions, k_positions) -> (H, Tq, Tk) fp32
ScoreBias = Callable[[Tensor, Tensor, Tensor], Tensor]  # (head, q_pos, k_pos) -> bias
# build the whole causal bias once per forward, shared by all layers, below this size
FULL_BIAS_BYTES = 256 * 2**20


class CausalBias:
    """A scheme's causal score bias for one forward, in the dtype of the attention scores.

    Positions and the bias are exact fp32; under bf16 autocast the bias is then rounded to bf16
    like the q·k scores it is added to (relative error 2^-9): keys stay distinct, but a far key's
    already small weight e^bias moves by up to |bias|/512.
    """

    def __init__(
        self,
        bias_fn: BiasFn,
        positions: Tensor,
        n_head: int,
        dtype: torch.dtype,
        block_size: int,
        full_bias_bytes: int | None = None,
    ) -> None:
        self.bias_fn = bias_fn
        self.positions = positions
        self.dtype = dtype
        seq_len = positions.shape[0]
        self.index = torch.arange(seq_len, device=positions.device)
        limit = FULL_BIAS_BYTES if full_bias_bytes is None else full_bias_bytes
        full = n_head * seq_len * seq_len * torch.finfo(dtype).bits // 8 <= limit
        self.block_size = seq_len if full else max(1, block_size)
        self.full = self._build(0, seq_len) if full else None

    def _build(self, start: int, end: int) -> Tensor:
        # causality is by index (the order of tokens), bias is by position (what the scheme sees)
        future = self.index[None, :end] > self.index[start:end, None]
        bias = self.bias_fn(self.positions[start:end], self.positions[:end])
        return bias.masked_fill(future, float("-inf")).to(self.dtype).unsqueeze(0)

    def block(self, start: int, end: int) -> Tensor:
        """(1, H, end − start, end): the bias of queries start..end−1 over keys 0..end−1."""
        if self.full is not None:
            return self.full[:, :, start:end, :end]
        return self._build(start, end)


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    bias_fn: BiasFn | None = None,
    dropout_p: float = 0.0,
    block_size: int = 1024,
    bias: CausalBias | None = None,
) -> Tensor:
    """q, k, v: (B, H, T, D); positions: (T,). Returns (B, H, T, D). The bias comes prepared
    (`bias`, as the model passes it) or as a function of positions (`bias_fn`)."""
    if bias is None and bias_fn is not None:
        bias = CausalBias(bias_fn, positions, q.shape[1], q.dtype, block_size, full_bias_bytes=0)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    seq_len = q.shape[-2]
    if bias.block_size < seq_len:
        # q, k, v arrive as transposed views; one copy here spares SDPA a copy of the growing
        # key/value prefix for every block
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    outputs = []
    for start in range(0, seq_len, bias.block_size):
        end = min(start + bias.block_size, seq_len)
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end],
                k[:, :, :end],
                v[:, :, :end],
                attn_mask=bias.block(start, end),
                dropout_p=dropout_p,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_kernel(device_type: str) -> Callable:
    if device_type == "cuda":
        return _compiled_flex_attention()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention  # eager: a reference path for tests on CPUs


class FlexMask:
    """The causal block mask and the score_mod of one forward (built once, used by all layers)."""

    def __init__(self, score_bias: ScoreBias | None, positions_fp32: Tensor) -> None:
        if not flex_available():
            raise ConfigError("model.attention=flex needs torch >= 2.5; use model.attention=sdpa")
        from torch.nn.attention.flex_attention import create_block_mask

        seq_len = positions_fp32.shape[0]
        device = positions_fp32.device

        def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return q_idx >= kv_idx

        self.block_mask = create_block_mask(causal, None, None, seq_len, seq_len, device=device)
        self.score_mod = None
        if score_bias is not None:
            pos = positions_fp32

            def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
                return score + score_bias(h, pos[q_idx], pos[kv_idx]).to(score.dtype)

            self.score_mod = score_mod


def flex_causal_attention(q: Tensor, k: Tensor, v: Tensor, mask: FlexMask) -> Tensor:
    kernel = _flex_kernel(q.device.type)
    return kernel(q, k, v, score_mod=mask.score_mod, block_mask=mask.block_mask)


# what the model hands every layer's attention for one forward (None: plain causal)
AttentionBias = CausalBias | FlexMask | None
