"""Tiny random Hugging Face causal LMs, the models `eval.py hf=` is checked on without the hub:
the tests (tests/hf_models.py re-exports this module) and the measured parity report
(scripts/pretrained_parity.py, docs/results/pretrained_parity.md) build the same ones here, so
what the report measures is what the tests assert.

Also here, for the same reason: the mapping of poslab's frequency kinds to Hugging Face's own
`rope_parameters` of the same kind, and float64 reference formulas of the kinds the attention
hook runs (ReRoPE, Self-Extend, LM-Infinite, log-n), written from a layer's weights with one
relative distance per query-key pair, independent of poslab's merged score matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the architectures eval.py hf= is tested on; `neox_partial` rotates half of each head
ARCHITECTURES = ("llama", "qwen2", "gpt_neox", "neox_partial", "gpt2")
ROTARY = ("llama", "qwen2", "gpt_neox", "neox_partial")
CONTEXT = 32  # max_position_embeddings of every tiny model


def tiny_text(lines: int = 200) -> list[str]:
    """A fixed text to train a tiny tokenizer on where no corpus is at hand (the parity script):
    the same lines on every machine, so the tokenizer and its vocabulary are too."""
    return [" ".join(f"w{(7 * i + 3 * j) % 53}" for j in range(12)) + " ." for i in range(lines)]


def tokenizer_for(source: Path | Iterable[str]) -> Any:  # -> PreTrainedTokenizerFast
    """A byte-level BPE tokenizer (300 tokens, <s> and </s>) trained on a corpus folder's
    train.txt or on the given lines: fast, as eval.py hf= requires."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = (source / "train.txt").read_text().splitlines() if isinstance(source, Path) else source
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def hf_config(arch: str, vocab_size: int, **rope: object) -> Any:
    """A tiny config of `arch`; `rope` sets HF's own rope_parameters (yarn, linear, ...)."""
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    # weights 10× HF's default spread: attention that is not near uniform, so a change of
    # positions shows in the logits
    shared = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, initializer_range=0.2)
    if arch == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=CONTEXT, **shared)
    sizes = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CONTEXT,
        **shared,
    )
    parameters = {"rope_theta": 10000.0, "rope_type": "default", **rope}
    if arch in ("gpt_neox", "neox_partial"):
        partial = 0.5 if arch == "neox_partial" else 1.0
        parameters["partial_rotary_factor"] = partial
        return GPTNeoXConfig(**sizes, rope_parameters=parameters, use_parallel_residual=False)
    config_class = LlamaConfig if arch == "llama" else Qwen2Config
    return config_class(**sizes, num_key_value_heads=2, rope_parameters=parameters)


def hf_model(arch: str, vocab_size: int, seed: int = 0, **rope: object) -> nn.Module:
    """A tiny random model of `arch` in eval mode, its weights drawn from `seed`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config(arch, vocab_size, **rope)).eval()


def save_tiny(arch: str, folder: Path, tokenizer: Any, seed: int = 0) -> Path:
    """A tiny random model of `arch` and `tokenizer` in `folder` (save_pretrained), as a hub
    model would be downloaded: what eval.py hf=FOLDER loads."""
    hf_model(arch, len(tokenizer), seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# -- poslab's frequency kinds and Hugging Face's own rope_parameters of the same kind ------------

FREQUENCY_KINDS = ("pi", "dynamic_ntk", "yarn", "llama3", "longrope")


def frequency_kind(
    kind: str, factor: float, pairs: int, context: int = CONTEXT
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(poslab's eval.rope_scaling options, HF's rope_parameters) of `kind` at `factor` for a
    model with `pairs` rotary pairs trained at `context`: the two that must give equal logits.
    YaRN takes poslab's `reference` ramp (HF's); longrope made-up per-pair factors (a model
    that ships them has them in its config)."""
    original = {"original_max_position_embeddings": context}
    if kind == "pi":
        return {"kind": "pi", "factor": factor}, {"rope_type": "linear", "factor": factor}
    if kind == "dynamic_ntk":
        return {"kind": "dynamic_ntk", "factor": factor}, {"rope_type": "dynamic", "factor": factor}
    if kind == "yarn":
        ours = {"kind": "yarn", "factor": factor, "ramp": "reference"}
        return ours, {"rope_type": "yarn", "factor": factor, **original}
    if kind == "llama3":
        theirs = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0}
        return {"kind": "llama3", "factor": factor}, {**theirs, "high_freq_factor": 4.0, **original}
    if kind == "longrope":
        lists = {
            "long_factor": [1.0 + 0.5 * i for i in range(pairs)],
            "short_factor": [1.0] * pairs,
        }
        ours = {"kind": "longrope", "factor": factor, **lists}
        return ours, {"rope_type": "longrope", "factor": factor, **lists, **original}
    raise ValueError(f"no Hugging Face rope_type for kind {kind!r}; one of {FREQUENCY_KINDS}")


# -- the attention hook's kinds, and a float64 reference of each formula --------------------------

HOOK_LENGTH = 40  # tokens per probe: beyond the trained context (32), so LM-Infinite's cap shows
# settings of each kind that change nothing over `length` tokens (LM-Infinite caps distances at
# L and log-n scales only past L: both neutral up to the context): (options, length)
NEUTRAL: dict[str, tuple[dict[str, Any], int]] = {
    "rerope": ({"kind": "rerope", "window": HOOK_LENGTH}, HOOK_LENGTH),
    "selfextend": ({"kind": "selfextend", "window": HOOK_LENGTH}, HOOK_LENGTH),
    "lminfinite": ({"kind": "lminfinite", "window": CONTEXT, "n_global": 0}, CONTEXT),
    "logn": ({"kind": "none", "logn": True}, CONTEXT),
    "string": ({"kind": "string", "shift": HOOK_LENGTH, "temperature": False}, HOOK_LENGTH),
    "dpe": ({"kind": "dpe", "window": 8, "groups": [1, 1]}, HOOK_LENGTH),  # G = 1: no grouping
}

W, G, N_GLOBAL = 8, 4, 2  # the window, Self-Extend's group, LM-Infinite's global tokens
S, S_LOCAL = 12, 4  # STRING's shift and local window
STRING_FACTOR = 0.1 * math.log(2) + 1  # STRING's cos/sin factor (HKUNLP/STRING)
DPE_GROUPS = (1, G)  # DPE's group size per band: the fast half of the pairs kept, the slow grouped
# settings that change attention within HOOK_LENGTH tokens: options, and the first position whose
# logits change
TRICKS: dict[str, tuple[dict[str, Any], int]] = {
    "rerope": ({"kind": "rerope", "window": W}, W + 1),
    "rerope_leaky": ({"kind": "rerope", "window": W, "leaky": 2.0}, W + 1),
    "selfextend": ({"kind": "selfextend", "window": W, "group": G}, W + 1),
    "lminfinite": ({"kind": "lminfinite", "window": W, "n_global": N_GLOBAL}, W + N_GLOBAL),
    "logn": ({"kind": "none", "logn": True}, CONTEXT),
    "rerope_logn": ({"kind": "rerope", "window": W, "logn": True}, W + 1),
    "string": ({"kind": "string", "shift": S, "local": S_LOCAL, "temperature": False}, S),
    # the temperature scales every score: from the second token on (the first sees only itself)
    "string_temperature": ({"kind": "string", "shift": S, "local": S_LOCAL}, 1),
    "dpe": ({"kind": "dpe", "window": W, "groups": list(DPE_GROUPS)}, W + 1),
}


def relative_distance(kind: str, m: Tensor, n: Tensor) -> Tensor:
    """The relative position each formula gives query m over key n (float64)."""
    d = m - n
    if kind in ("rerope", "rerope_logn"):  # min(m − n, w)
        return d.clamp(max=W)
    if kind == "rerope_leaky":  # w + (m − n − w)/k beyond the window
        return torch.where(d < W, d, W + (d - W) / 2.0)
    if kind == "selfextend":  # grouped: ⌊m/G⌋ + w − ⌊w/G⌋ − ⌊n/G⌋ beyond the window
        grouped = torch.div(m, G, rounding_mode="floor") + W - W // G
        return torch.where(d < W, d, grouped - torch.div(n, G, rounding_mode="floor"))
    if kind == "lminfinite":  # distances capped at L
        return d.clamp(max=CONTEXT)
    if kind in ("string", "string_temperature"):  # the paper's m − n − S + W from S on
        return torch.where(d < S, d, d - S + S_LOCAL)
    if kind == "dpe":  # per band b (…, bands): ⌊m/G_b⌋ + w − w/G_b − ⌊n/G_b⌋ beyond the window
        group = torch.tensor(DPE_GROUPS, dtype=torch.float64)
        m, n = m[..., None], n[..., None]
        grouped = torch.div(m, group, rounding_mode="floor") + W - W / group
        far = grouped - torch.div(n, group, rounding_mode="floor")
        return torch.where(d[..., None] < W, d[..., None], far)
    return d  # logn


def turned(x: Tensor, angles: Tensor) -> Tensor:
    """HF's rotate_half rotation of the first R dims of x (…, D) by angles (…, R/2)."""
    half = angles.shape[-1]
    a, b, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((a * cos - b * sin, a * sin + b * cos, rest), dim=-1)


def projections(attention: nn.Module, x: Tensor) -> tuple[Tensor, ...]:
    """q, k, v (B, H, T, D) in float64 from the layer's weights, grouped heads repeated."""
    config = attention.config
    heads = config.num_attention_heads
    x = x.double()
    if hasattr(attention, "query_key_value"):  # GPT-NeoX: one projection, per head q|k|v
        weight, bias = attention.query_key_value.weight, attention.query_key_value.bias
        qkv = F.linear(x, weight.double(), bias.double()).unflatten(-1, (heads, -1))
        return tuple(t.transpose(1, 2) for t in qkv.chunk(3, dim=-1))

    def project(linear: nn.Linear) -> Tensor:
        bias = None if linear.bias is None else linear.bias.double()
        out = F.linear(x, linear.weight.double(), bias)
        return out.unflatten(-1, (-1, attention.head_dim)).transpose(1, 2)

    q, k, v = (project(p) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
    groups = heads // k.shape[1]
    return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def reference_attention(kind: str, attention: nn.Module, theta: Tensor, x: Tensor) -> Tensor:
    """One layer's attention output (B, T, d_model) in float64 as `kind` (a TRICKS key) defines
    it: the score of query m over key n is (query turned by relative_distance(m, n)) · key,
    causal, with LM-Infinite's Λ (the first n_global keys and those closer than the window) and
    log-n's query scale max(1, ln(m + 1)/ln L)."""
    q, k, v = projections(attention, x)
    length, dim = q.shape[-2], q.shape[-1]
    m = torch.arange(length, dtype=torch.float64)[:, None]
    n = torch.arange(length, dtype=torch.float64)[None, :]
    if kind in ("logn", "rerope_logn"):
        q = q * (torch.log(m + 1) / math.log(CONTEXT)).clamp(min=1.0)
    distance = relative_distance(kind, m, n)  # (T, T), or (T, T, bands) for dpe
    if distance.dim() == 3:  # each band's distance for its share of the pairs
        distance = distance.repeat_interleave(theta.shape[-1] // distance.shape[-1], dim=-1)
    else:
        distance = distance[..., None]
    angles = distance * theta.double()  # (T, T, R/2)
    queries = turned(q[:, :, :, None, :].expand(-1, -1, -1, length, -1), angles)  # one per key
    products = queries * k[:, :, None, :, :]
    if kind == "string_temperature":  # q and k each turned by cos/sin times the factor: only
        rotated = 2 * theta.shape[-1]  # the rotated dims carry it (partial rotary: the first R)
        products = torch.cat(
            (products[..., :rotated] * STRING_FACTOR**2, products[..., rotated:]), -1
        )
    scores = products.sum(-1) * dim**-0.5
    seen = n <= m
    if kind == "lminfinite":
        seen = seen & ((m - n < W) | (n < N_GLOBAL))
    weights = scores.masked_fill(~seen, float("-inf")).softmax(dim=-1)
    out = (weights @ v).transpose(1, 2).flatten(-2)
    output = getattr(attention, "o_proj", None) or attention.dense
    bias = None if output.bias is None else output.bias.double()
    return F.linear(out, output.weight.double(), bias)


def attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def recorded_attention(
    model: nn.Module, forward: Callable[[Tensor], Any], ids: Tensor
) -> list[tuple[nn.Module, Tensor, Tensor]]:
    """(layer, input, output) of every attention layer of `model` in one call of `forward`
    (a PretrainedLM wrapping it, hooked or not)."""
    records = []

    def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        records.append((module, x.detach(), output[0].detach()))

    handles = [
        layer.register_forward_hook(record, with_kwargs=True) for layer in attention_layers(model)
    ]
    try:
        with torch.inference_mode():
            forward(ids)
    finally:
        for handle in handles:
            handle.remove()
    return records
