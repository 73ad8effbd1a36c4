"""Eval-time tricks inside the attention of a pretrained HF model: ReRoPE, Self-Extend,
LM-Infinite (`eval.rope_scaling.kind=rerope|selfextend|lminfinite`) and log-n
(`eval.logn_scaling=true`, with any kind).

They change attention itself (two score matrices merged by distance, a Λ mask, queries scaled by
position), not only the rotary frequencies, so they cannot reach an HF model through its rotary
module as the frequency kinds do (pretrained.py). Instead, for the forward of a wrapper that asks
for them:

* the model's rotary module hands out the identity rotation (inv_freq = 0: cos = 1, sin = 0,
  exactly), so queries and keys reach the attention function unrotated;
* the model's attention implementation is `poslab`, a function registered with transformers'
  AttentionInterface, which applies poslab's own `Rotary` scheme (θ = the model's inv_freq,
  `half` pairing as HF's rotate_half, `fraction` = rotated dims / head dim) with the requested
  RopeScaling: `rotate`, then poslab's blockwise kernel with `modify_scores`, the code poslab's
  own checkpoints are evaluated with; log-n alone rotates and then runs SDPA.

Outside such a forward the model keeps its own implementation (sdpa) and frequencies. Which
models it serves is decided by a probe (pretrained.check_hook): the hook with settings that change
nothing must give the model's own logits; tested on Llama, Qwen2 and GPT-NeoX (also with partial
rotary), and Mistral runs Llama's attention code.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.model.attention import Blockwise
from poslab.positions.base import Prepared
from poslab.positions.rope import Rotary
from poslab.positions.rope_scaling import RopeScaling

HOOK = "poslab"  # the name of the attention function in transformers' AttentionInterface
SERVED = "Llama, Mistral, Qwen2 and GPT-NeoX (partial rotary included)"
# fp32 score elements per block of queries (B · H · block · T): 512 MiB per score matrix, so a
# long evaluation's memory grows linearly with its length, as in poslab's own blockwise kernel
SCORE_BUDGET = 2**27
MAX_BLOCK = 1024  # poslab's attention.block_size default


def needs_hook(scaling: RopeScaling | None) -> bool:
    """Whether `scaling` changes attention beyond the rotary frequencies (the hook's kinds)."""
    return scaling is not None and (scaling.needs_scores or scaling.logn)


# the scheme and prepared positions of the forward running now (`hooked`)
_ACTIVE: ContextVar[tuple[Rotary, Prepared] | None] = ContextVar("poslab_hook", default=None)


def head_dim(config: Any) -> int:
    """The model's head dim (HF's own rule: `head_dim`, else hidden_size / heads)."""
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def hook_scheme(
    config: Any, inv_freq: Tensor, base: float | None, scaling: RopeScaling | None
) -> Rotary:
    """poslab's rotary scheme for a model with frequencies `inv_freq` (R/2,) and `scaling`
    (None: plain rotary, the probe's): θ exactly the model's, `half` pairing, the first R dims of
    each head rotated."""
    heads, dim = int(config.num_attention_heads), head_dim(config)
    rotary_dims = 2 * inv_freq.shape[-1]
    if base is None or base <= 1:  # θ_1 = base^(−2/R): the base YaRN's reference ramp reads
        base = float(inv_freq[1]) ** (-rotary_dims / 2) if rotary_dims > 2 else 10000.0
    scheme = Rotary(
        heads * dim,
        heads,
        base=base,
        pairing="half",
        fraction=rotary_dims / dim,
        scaling=None if scaling is None else scaling.options(),
    )
    scheme.set_theta(inv_freq.detach().float().clone())  # HF's numbers, not recomputed
    return scheme.to(inv_freq.device)


def register() -> None:
    """Register the `poslab` attention function with transformers (idempotent). No mask
    function is registered: transformers then builds no mask for it, and the hook masks by
    token order itself (the wrapper never pads)."""
    from transformers import AttentionInterface

    AttentionInterface.register(HOOK, poslab_attention)


@contextmanager
def hooked(hf_model: nn.Module, scheme: Rotary | None, positions: Tensor) -> Iterator[None]:
    """Within: `hf_model` attends through the hook with `scheme` at `positions` ((T,) or (B, T),
    prepared once for every layer); after: its own implementation again. None: nothing changes."""
    if scheme is None:
        yield
        return
    register()
    own = hf_model.config._attn_implementation
    hf_model.set_attn_implementation(HOOK)
    token = _ACTIVE.set((scheme, scheme.prepare(positions)))
    try:
        if hf_model.config._attn_implementation != HOOK:  # a model that cannot switch: it warns
            raise ConfigError(
                f"{type(hf_model).__name__} cannot switch its attention implementation, so the "
                f"attention hook cannot serve it; it serves {SERVED}"
            )
        yield
    finally:
        _ACTIVE.reset(token)
        hf_model.set_attn_implementation(own)


def _block_size(batch: int, heads: int, keys: int) -> int:
    return max(1, min(MAX_BLOCK, SCORE_BUDGET // max(1, batch * heads * keys)))


def poslab_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: q (B, H, T, D), k and v (B, H_kv, T, D)
    unrotated -> (B, T, H, D). The layer's own `scaling` and sliding window are kept; grouped
    key/value heads are repeated for the query heads."""
    active = _ACTIVE.get()
    if active is None:
        raise RuntimeError(
            f"attention implementation {HOOK!r} runs only inside poslab's PretrainedLM forward"
        )
    scheme, prepared = active
    batch, heads, length, dim = query.shape
    if dim != scheme.head_dim or length != prepared.fp32.shape[-1]:
        raise ConfigError(
            f"{type(module).__name__}: queries of head dim {dim} over {length} tokens, where the "
            f"attention hook expected {scheme.head_dim} and {prepared.fp32.shape[-1]}; it serves "
            f"{SERVED}"
        )
    if attention_mask is not None or key.shape[-2] != length:  # padding or a cache: not ours
        raise ConfigError(
            f"{type(module).__name__}: the attention hook takes whole windows without a padding "
            "mask or a cache (as poslab's scorer feeds them)"
        )
    groups = heads // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if scaling is not None and not math.isclose(scaling * math.sqrt(dim), 1.0, rel_tol=1e-12):
        query = query * (scaling * math.sqrt(dim))  # poslab's kernels scale by D^(−1/2)
    q, k = scheme.rotate(query, key, prepared)
    if scheme.needs == "scores" or sliding_window is not None:
        kernel = Blockwise(_block_size(batch, heads, length), window=sliding_window)
        out = kernel(q, k, value, scheme, prepared, None, 0, 0.0)
    else:  # log-n alone: rotated and scaled queries, then the fused causal kernel
        out = F.scaled_dot_product_attention(q, k, value, is_causal=True)
    return out.transpose(1, 2).contiguous(), None
