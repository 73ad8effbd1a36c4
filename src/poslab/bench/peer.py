"""x-transformers, the peer: the same size and scheme built with its TransformerWrapper."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.bench.timing import LossFn
from poslab.positions.t5 import auto_max_distance


def peer_kwargs(scheme: str, config: dict[str, Any]) -> tuple[dict, dict, str] | str:
    """(TransformerWrapper kwargs, Decoder kwargs, note) of the x-transformers model equivalent to
    poslab's `config`, or why there is none. Read against x_transformers 2.x's source."""
    m, pos = config["model"], config["pos"]
    d, heads = m["d_model"], m["n_head"]
    head_dim = d // heads
    wrapper: dict[str, Any] = {"use_abs_pos_emb": False}
    layers: dict[str, Any] = {
        "dim": d,
        "depth": m["n_layer"],
        "heads": heads,
        "attn_dim_head": head_dim,
        "ff_mult": m["d_ff"] / d,
        # flash = F.scaled_dot_product_attention, the kernel poslab uses too
        "attn_flash": True,
        "verbose": False,
    }
    note = ""
    if scheme == "nope":
        pass
    elif scheme == "learned":
        wrapper["use_abs_pos_emb"] = True  # AbsolutePositionalEmbedding(max_seq_len rows)
    elif scheme == "sinusoidal":
        wrapper.update(use_abs_pos_emb=True, scaled_sinu_pos_emb=True)
        note = "ScaledSinusoidalEmbedding (sin/cos × a learned scalar)"
    elif scheme == "rope":
        # x-transformers rotates interleaved pairs, and by default only half of each head
        layers.update(rotary_pos_emb=True, rotary_emb_dim=round(head_dim * pos.get("fraction", 1)))
    elif scheme == "alibi":
        layers["alibi_pos_bias"] = True
    elif scheme == "xpos":
        layers.update(
            rotary_xpos=True,
            rotary_emb_dim=round(head_dim * pos.get("fraction", 1)),
            rotary_xpos_scale_base=pos.get("scale_base", 512),
        )
    elif scheme == "t5":
        t5 = _t5_layers(pos)
        if isinstance(t5, str):
            return t5
        layers.update(t5)
        note = "x-transformers' T5 bias cannot use SDPA (it asserts), so it runs its einsum path"
    elif scheme == "cope":
        layers.update(attn_use_cope=True, attn_cope_max_pos=pos.get("npos", 64), attn_flash=False)
        note = "x-transformers' CoPE cannot use SDPA (it asserts), so it runs its einsum path"
    elif scheme == "fox":
        # the forgetting transformer's data-dependent alibi (x-transformers' reference of FoX)
        layers.update(attn_data_dependent_alibi=True)
        note = "data_dependent_alibi: its forget-gate bias, a dense (T, T) bias through SDPA"
    else:
        return f"x-transformers has no equivalent of `{scheme}`"
    return wrapper, layers, note


def _t5_layers(pos: dict[str, Any]) -> dict[str, Any] | str:
    """The Decoder kwargs of poslab's T5 bias `pos`, or why x-transformers has none. Apart
    from peer_kwargs because only T5 resolves settings (`auto` max_distance) and can refuse."""
    buckets = pos.get("num_buckets", 32)
    max_distance = pos.get("max_distance", 128)
    if max_distance == "auto":
        max_distance = auto_max_distance(pos.get("train_length"), buckets)
    if buckets > max_distance:
        return (
            f"x-transformers requires num_buckets ≤ max_distance (here {buckets} > "
            f"{max_distance}, `auto` at L={pos.get('train_length')})"
        )
    return {
        "rel_pos_bias": True,
        "rel_pos_num_buckets": buckets,
        "rel_pos_max_distance": max_distance,
        "attn_flash": False,  # x-transformers refuses flash with rel_pos_bias
    }


def build_peer(
    scheme: str, config: dict[str, Any], vocab: int, max_seq_len: int
) -> tuple[nn.Module | None, str]:
    """The x-transformers model for `scheme` (tied embeddings, same size), or (None, why not)."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None, 'x-transformers is not installed: pip install -e ".[bench]"'
    spec = peer_kwargs(scheme, config)
    if isinstance(spec, str):
        return None, spec
    wrapper, layers, note = spec
    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=vocab,
        max_seq_len=max_seq_len,
        tie_embedding=True,
        attn_layers=Decoder(**layers),
        **wrapper,
    )
    return model, note


def peer_loss(model: nn.Module) -> LossFn:
    """Cross-entropy over the peer's logits, as x-transformers users write it."""

    def loss_fn(inputs: Tensor, targets: Tensor) -> Tensor:
        logits = model(inputs)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return loss_fn


def peer_version() -> str:
    try:
        from importlib.metadata import version

        return version("x-transformers")
    except Exception:
        return "not installed"
