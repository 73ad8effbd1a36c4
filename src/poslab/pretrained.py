"""A pretrained Hugging Face causal LM in poslab's evaluation: `python eval.py hf=ID_OR_FOLDER
data_path=DIR`.

The model is wrapped (`PretrainedLM`) so the scorer (evaluation/perplexity.py) sees what it sees
of a poslab GPT: `hidden_states(tokens, positions)` (the base model's final normalised states),
`lm_head.weight` and `pos`. Logits are then computed in chunks fused with the loss, as for
poslab's own models, so a long window never materialises (tokens × vocab) logits. A probe at load
time checks that this path gives the model's own loss (an output bias, a logit cap or scale would
not): a model it does not reproduce is refused, never scored wrong.

Eval-time RoPE extension (eval.rope_scaling) reaches the model through its rotary embedding
module (`inv_freq` and `attention_scaling`, one per model in Llama, Qwen2, Mistral, GPT-NeoX, …):
the frequencies are poslab's own (positions/rope_scaling.py), the same numbers a poslab checkpoint
gets, and equal to HF's `rope_parameters` of the same kind (tests/test_pretrained.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from poslab.data.tokens import TokenizedSplit
from poslab.errors import ConfigError
from poslab.positions.rope_scaling import RopeScaling, resolve_factor

# eval.rope_scaling kinds that change only the rotary frequencies (and the cos/sin factor): they
# reach an HF model through its rotary module. The others merge score matrices or scale queries
# inside poslab's attention kernels, which an HF model does not run.
FREQUENCY_KINDS = ("pi", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope")
PROBE_TOKENS = 24


def _load_failed(source: str, what: str, err: BaseException) -> ConfigError:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    local = Path(source).expanduser().exists()
    hint = (
        "save the model there with save_pretrained (config.json, the weights and the tokenizer)"
        if local
        else "offline or a wrong id? pass a local folder made with save_pretrained"
    )
    return ConfigError(f"hf={source}: could not load its {what} ({reason[:160]}); {hint}")


def load_pretrained(source: str, device: torch.device, precision: str) -> tuple[nn.Module, Any]:
    """The causal LM and its (fast) tokenizer at `source` (a hub id or a local folder), in eval
    mode on `device`: weights in bf16 on a GPU under bf16-mixed, else fp32 (autocast then runs
    the matmuls in the eval precision). Anything unusable is one line, before any scoring."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()  # its load reports are not the user's business
    transformers.logging.disable_progress_bar()
    if Path(source).expanduser().is_file():
        raise ConfigError(f"hf={source} is a file; pass the model's folder (with config.json)")
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as err:  # OSError, ValueError, hub errors: many types across versions
        raise _load_failed(source, "config", err) from None
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if config.model_type not in causal:
        raise ConfigError(
            f"hf={source} is a {config.model_type} model, not a causal language model; "
            "pass a decoder (AutoModelForCausalLM: Llama, Qwen2, Mistral, GPT-NeoX, GPT-2, ...)"
        )
    dtype = torch.bfloat16 if device.type == "cuda" and precision == "bf16-mixed" else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except Exception as err:
        raise _load_failed(source, "weights", err) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as err:
        raise _load_failed(source, "tokenizer", err) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"hf={source}: its tokenizer is a slow (Python) one; poslab needs a fast tokenizer "
            "(tokenizer.json) to place word and byte counts on tokens"
        )
    return model.eval().to(device), tokenizer


def rotary_modules(model: nn.Module) -> list[nn.Module]:
    """The model's rotary embedding modules (those holding an `inv_freq` buffer)."""
    return [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), Tensor)]


def position_table(model: nn.Module) -> int | None:
    """The size of a learned absolute position table (GPT-2's wpe, ...), or None."""
    base = model.base_model
    words = model.get_input_embeddings()
    for module in base.children():
        if isinstance(module, nn.Embedding) and module is not words:
            return int(module.num_embeddings)
    return None


def trained_context(model: nn.Module, source: str, context: int | None) -> int:
    """The context the model was trained at: hf_context, else its config's
    max_position_embeddings."""
    if context is not None:
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ConfigError(f"hf_context={context} must be a positive number of tokens")
        return context
    value = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"hf={source}: its config gives no max_position_embeddings; set hf_context=N (the "
            "context it was trained at) so that lengths are multiples of it"
        )
    return value


class PretrainedPositions:
    """What the scorer asks of a model's `pos`: token positions as given, and whether a length
    fits (a learned position table has a last row)."""

    position_axes = 0

    def __init__(self, table: int | None, source: str) -> None:
        self.table, self.source = table, source

    def text_positions(self, positions: Tensor) -> Tensor:
        return positions

    def check_length(self, last_position: int) -> None:
        if self.table is not None and last_position >= self.table:
            raise ConfigError(
                f"hf={self.source} has learned positions 0..{self.table - 1}; position "
                f"{last_position} has no row: evaluate lengths up to {self.table} "
                "(eval.unsupported=skip shows a '—' cell instead)"
            )


@dataclass
class RotaryState:
    """The frequencies (fp32) and cos/sin factor a length evaluates with, per rotary module."""

    inv_freq: list[Tensor]
    attention_scaling: list[float]


class PretrainedLM(nn.Module):
    """An HF causal LM, seen by the scorer as a poslab GPT (see module doc). Several instances
    (one per eval-time frequency setting) share one HF model; each puts its frequencies in
    before its forward."""

    def __init__(self, hf_model: nn.Module, source: str, rotary: RotaryState | None) -> None:
        super().__init__()
        self.hf = hf_model
        self.source = source
        self.rotary = rotary
        self.lm_head = hf_model.get_output_embeddings()
        self.pos = PretrainedPositions(position_table(hf_model), source)
        self.config = hf_model.config  # .vocab_size, as a GPTConfig has

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def hidden_states(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """(B, T) token ids and (T,) or (B, T) positions -> the final normalised states."""
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device)
        if positions.dim() == 1:
            positions = positions.expand(idx.shape[0], -1)
        if self.rotary is not None:
            for module, inv_freq, factor in zip(
                rotary_modules(self.hf),
                self.rotary.inv_freq,
                self.rotary.attention_scaling,
                strict=True,
            ):
                module.inv_freq = inv_freq.to(module.inv_freq.device)
                module.attention_scaling = factor
        out = self.hf.base_model(input_ids=idx, position_ids=positions, use_cache=False)
        return out.last_hidden_state

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.lm_head(self.hidden_states(idx, positions))


def rotary_state(
    hf_model: nn.Module, source: str, scaling: RopeScaling | None, length: int
) -> RotaryState:
    """The frequencies of every rotary module at `length` under `scaling` (None: as trained)."""
    modules = rotary_modules(hf_model)
    original = [getattr(m, "original_inv_freq", m.inv_freq).detach().float() for m in modules]
    trained = [float(getattr(m, "attention_scaling", 1.0)) for m in modules]
    if scaling is None:
        return RotaryState(original, trained)
    if not modules:
        raise ConfigError(
            f"eval.rope_scaling.kind={scaling.kind}: hf={source} ({type(hf_model).__name__}) "
            "has no rotary embedding module (inv_freq) to rescale; set eval.rope_scaling.kind=none"
        )
    shipped = {str(getattr(m, "rope_type", "default")) for m in modules}
    if shipped - {"default"}:
        raise ConfigError(
            f"eval.rope_scaling.kind={scaling.kind}: hf={source} already ships rope_type="
            f"{','.join(sorted(shipped - {'default'}))}; evaluate it as shipped "
            "(eval.rope_scaling.kind=none) or from a copy whose config has the default rotary"
        )
    base = _rope_base(hf_model.config)
    frequencies = []
    for inv_freq in original:
        rotary_dims = 2 * inv_freq.shape[-1]
        scaling.check_dims(rotary_dims)
        theta = scaling.theta(inv_freq, rotary_dims, length, base)
        frequencies.append(theta * scaling.position_scale)  # PI: m/s · θ = m · θ/s
    return RotaryState(frequencies, [scaling.attention_factor] * len(modules))


def _rope_base(config: Any) -> float | None:
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else None
    return float(base or getattr(config, "rope_theta", 0) or 0) or None


def check_scaling_kind(options: dict[str, Any] | None, source: str) -> None:
    """eval.rope_scaling / eval.logn_scaling options an HF model cannot take: one line."""
    if not options:
        return
    kind = options.get("kind", "none")
    if kind not in ("none", *FREQUENCY_KINDS):
        raise ConfigError(
            f"eval.rope_scaling.kind={kind} merges score matrices inside poslab's attention "
            f"kernels, which hf={source} does not run; with hf= use one of "
            f"{', '.join(FREQUENCY_KINDS)} (or evaluate a poslab checkpoint)"
        )
    if options.get("logn"):
        raise ConfigError(
            f"eval.logn_scaling=true scales queries inside poslab's attention kernels, which "
            f"hf={source} does not run; set eval.logn_scaling=false"
        )


def check_probe(model: PretrainedLM, device: torch.device) -> None:
    """poslab's scorer (final states × the output matrix) against the model's own logits on a
    short random probe: an output bias, a logit cap or scale makes them differ, and such a model
    is refused (its perplexities would be wrong)."""
    import torch.nn.functional as F

    from poslab.losses import linear_token_nll

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, PROBE_TOKENS + 1), generator=generator)
    ids = ids.to(device)
    with torch.inference_mode():
        logits = model.hf(input_ids=ids[:, :-1], use_cache=False).logits.float()
        theirs = F.cross_entropy(logits[0], ids[0, 1:], reduction="none")
        hidden = model.hidden_states(ids[:, :-1])
        ours = linear_token_nll(hidden.float(), model.lm_head.weight.float(), ids[:, 1:])[0]
        # a model whose early logits move when a later token changes is not causal (BERT
        # loaded as a causal LM): its perplexities would read the future
        changed = ids.clone()
        changed[0, PROBE_TOKENS - 1] = (changed[0, PROBE_TOKENS - 1] + 1) % model.vocab_size
        moved = model.hf(input_ids=changed[:, :-1], use_cache=False).logits.float()
    if (moved[0, : PROBE_TOKENS - 1] - logits[0, : PROBE_TOKENS - 1]).abs().max() > 1e-4:
        raise ConfigError(
            f"hf={model.source} ({type(model.hf).__name__}) is not causal: its logits at a "
            "position change with a later token (an encoder such as BERT without "
            "is_decoder=true?); pass a decoder-only language model"
        )
    gap = float((ours - theirs).abs().max())
    if not math.isfinite(gap) or gap > 1e-3 * max(1.0, float(theirs.abs().max())):
        raise ConfigError(
            f"hf={model.source} ({type(model.hf).__name__}): poslab's scorer does not reproduce "
            f"the model's own loss (largest gap {gap:.3g} nats: an output bias, a logit cap or "
            "scale?); this architecture is not supported by eval.py hf="
        )


def encode_text(tokenizer: Any, lines: list[str], chunk_lines: int = 2000) -> TokenizedSplit:
    """The lines as the model reads text (each ending in a newline, tokenized in chunks of whole
    lines, no special tokens), with each line's words and bytes on the token that holds its
    newline, as poslab's own splits carry them on <eos> (data/tokens.py)."""
    ids, words, nbytes = [], [], []
    for start in range(0, len(lines), chunk_lines):
        chunk = [line.rstrip("\n") for line in lines[start : start + chunk_lines]]
        text = "".join(line + "\n" for line in chunk)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        token_ids = np.asarray(enc["input_ids"], dtype=np.int64)
        # the token that holds character c: the last token starting at or before it
        starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
        w = np.zeros(len(token_ids), dtype=np.int64)
        b = np.zeros(len(token_ids), dtype=np.int64)
        end = 0
        for line in chunk:
            end += len(line) + 1  # the newline's index + 1
            holder = max(0, int(np.searchsorted(starts, end - 1, side="right")) - 1)
            w[holder] += len(line.split()) + 1
            b[holder] += len(line.encode("utf-8")) + 1
        ids.append(token_ids)
        words.append(w)
        nbytes.append(b)
    if not ids:
        return TokenizedSplit(*(np.zeros(0, dtype=np.int32) for _ in range(3)))
    return TokenizedSplit(
        np.concatenate(ids).astype(np.int32),
        np.concatenate(words).astype(np.int32),
        np.concatenate(nbytes).astype(np.int32),
    )


def start_token(tokenizer: Any) -> int:
    """The token a split is preceded by (so its first token is scored): BOS, else EOS."""
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


def models_per_length(
    hf_model: nn.Module,
    source: str,
    options: dict[str, Any] | None,
    lengths: list[int],
    context: int,
    device: torch.device,
) -> dict[int, PretrainedLM]:
    """length -> the model as evaluated there: the trained frequencies (checked on the probe
    first), or those of the eval-time kind at that length (one wrapper per distinct setting; all
    share the HF model)."""
    plain = PretrainedLM(hf_model, source, rotary_state(hf_model, source, None, context))
    check_probe(plain, device)
    models: dict[int, PretrainedLM] = {}
    built: dict[str, PretrainedLM] = {}
    for length in lengths:
        scaling = None
        if options is not None:
            factor = resolve_factor(options["kind"], options.get("factor", "auto"), length, context)
            scaling = RopeScaling(**{**options, "factor": factor, "train_length": context})
        if scaling is None or scaling.is_identity():
            models[length] = plain
            continue
        # dynamic_ntk and longrope read the length itself: one setting per length
        reads_length = scaling.kind in ("dynamic_ntk", "longrope")
        key = f"{scaling!r}@{length if reads_length else ''}"
        if key not in built:
            built[key] = PretrainedLM(
                hf_model, source, rotary_state(hf_model, source, scaling, length)
            )
        models[length] = built[key]
    return models
