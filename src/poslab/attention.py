"""Causal attention kernels.

* No score bias (nope, learned, sinusoidal, rope): one `scaled_dot_product_attention` call with
  `is_causal=True`, which dispatches to flash / memory-efficient kernels on CUDA and to the fused
  flash kernel on CPU, so memory grows linearly with the length.
* With a score bias (alibi, t5, ...): queries are processed in blocks of `block_size`; each block
  sees only the keys up to its last query and gets its bias built for that block alone. Memory is
  O(block_size · T) per head instead of O(T²), so 16× the training length fits on a CPU; a block
  as long as the sequence is exactly the plain full-matrix path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

BiasFn = Callable[[Tensor, Tensor], Tensor]  # (q_positions, k_positions) -> (H, Tq, Tk) fp32


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    bias_fn: BiasFn | None = None,
    dropout_p: float = 0.0,
    block_size: int = 1024,
) -> Tensor:
    """q, k, v: (B, H, T, D); positions: (T,). Returns (B, H, T, D)."""
    if bias_fn is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    seq_len = q.shape[-2]
    index = torch.arange(seq_len, device=q.device)
    outputs = []
    for start in range(0, seq_len, block_size):
        end = min(start + block_size, seq_len)
        # causality is by index (the order of tokens), bias is by position (what the scheme sees)
        future = index[None, :end] > index[start:end, None]
        bias = bias_fn(positions[start:end], positions[:end]).masked_fill(future, float("-inf"))
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end],
                k[:, :, :end],
                v[:, :, :end],
                # positions and bias are exact fp32; under bf16 autocast the bias is then rounded
                # to bf16 like the q·k scores it is added to (relative error 2^-9): keys stay
                # distinct, but a far key's already small weight e^bias moves by up to |bias|/512
                attn_mask=bias.to(q.dtype).unsqueeze(0),
                dropout_p=dropout_p,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
