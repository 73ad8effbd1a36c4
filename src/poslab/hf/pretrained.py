"""A pretrained Hugging Face causal LM in poslab's evaluation: `python eval.py hf=ID_OR_FOLDER
data_path=DIR`.

The model is wrapped (`PretrainedLM`) so the scorer (evaluation/perplexity.py) sees what it sees
of a poslab GPT: `hidden_states(tokens, positions)` (the base model's final normalised states),
`lm_head.weight` and `pos`. Logits are then computed in chunks fused with the loss, as for
poslab's own models, so a long window never materialises (tokens × vocab) logits. A probe at load
time checks that this path gives the model's own loss (an output bias, a logit cap or scale would
not): a model it does not reproduce is refused, never scored wrong.

Eval-time RoPE extension (eval.rope_scaling) reaches the model in one of two ways:

* the kinds that change only the frequencies (not `needs_scores`) through its rotary embedding
  module (`inv_freq` and `attention_scaling`, one per model in Llama, Qwen2, Mistral, GPT-NeoX,
  …): the frequencies are poslab's own (positions/extensions/), the same numbers a poslab
  checkpoint gets, and equal to HF's `rope_parameters` of the same kind
  (tests/hf/test_pretrained.py);
* rerope, selfextend, lminfinite and eval.logn_scaling, which change attention itself, through an
  attention hook (pretrained_attention.py) that runs poslab's rotary scheme and kernel inside the
  model's layers; a probe checks that the hook reproduces the model before it is used.

Without them (eval.rope_scaling.kind=none) the model is evaluated as shipped: its rotary module
is left to compute its own frequencies, also a rotary that reads the length (HF's rope_type
dynamic, longrope); each forward starts from the state a freshly loaded model has, so a window
reads what a fresh model reads on it, whatever was evaluated before. A model that ships a
non-default rope_type refuses every eval-time kind and log-n (`_check_rescalable`).

dynamic_ntk and longrope read the length: on both paths that is each window's span (max − min
position + 1), as poslab's own Rotary reads it, so a split's last, shorter window gets the
frequencies of its own span, not of the nominal length.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from poslab.data.tokens import TokenizedSplit
from poslab.errors import ConfigError
from poslab.hf.pretrained_attention import SERVED, hook_scheme, hooked, needs_hook
from poslab.positions.rope import Rotary
from poslab.positions.rope_scaling import RopeScaling, resolve_factor

PROBE_TOKENS = 24
# the attention hook's probe with bf16 weights: the largest RMS of (hook − model) logits, as a
# fraction of the model's logits' RMS (pretrained.check_hook)
BF16_PROBE_RMS = 0.05


def _code_file(err: BaseException) -> str | None:
    """The model's own code file (remote code: HF runs it from its transformers_modules copy)
    where `err` was raised, or None for a failure elsewhere (the weights, the hub)."""
    if isinstance(err, SyntaxError) and "transformers_modules" in str(err.filename):
        return Path(str(err.filename)).name
    frames = traceback.extract_tb(err.__traceback__)
    files = [f.filename for f in frames if "transformers_modules" in f.filename]
    return Path(files[-1]).name if files else None


def _load_failed(source: str, what: str, err: BaseException) -> ConfigError:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if (code := _code_file(err)) is not None:
        # a broken modeling file is not "could not load its weights": say which file failed
        return ConfigError(
            f"hf={source}: its model code {code} failed to run ({type(err).__name__}: "
            f"{reason[:160]}); restore that file, or export the run again"
        )
    local = Path(source).expanduser().exists()
    hint = (
        "save the model there with save_pretrained (config.json, the weights and the tokenizer)"
        if local
        else "offline or a wrong id? pass a local folder made with save_pretrained"
    )
    return ConfigError(f"hf={source}: could not load its {what} ({reason[:160]}); {hint}")


def load_pretrained(
    source: str, device: torch.device, precision: str, trust_remote_code: bool = False
) -> tuple[nn.Module, Any]:
    """The causal LM and its (fast) tokenizer at `source` (a hub id or a local folder), in eval
    mode on `device`: weights in bf16 on a GPU under bf16-mixed, else fp32 (autocast then runs
    the matmuls in the eval precision). `trust_remote_code`: run the model code the folder holds
    (a poslab export of any scheme, hf/export.py). Anything unusable is one line, before any
    scoring."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()  # its load reports are not the user's business
    transformers.logging.disable_progress_bar()
    if Path(source).expanduser().is_file():
        raise ConfigError(f"hf={source} is a file; pass the model's folder (with config.json)")
    trust = {"trust_remote_code": trust_remote_code}  # explicit: HF would otherwise prompt
    try:
        config = AutoConfig.from_pretrained(source, **trust)
    except Exception as err:  # OSError, ValueError, hub errors: many types across versions
        if "trust_remote_code" in str(err):
            raise ConfigError(
                f"hf={source} holds its own model code (auto_map; a poslab export of a scheme "
                "with no native HF architecture does); read it, then pass "
                "hf_trust_remote_code=true to run it"
            ) from None
        raise _load_failed(source, "config", err) from None
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    own_causal = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if config.model_type not in causal and not (trust_remote_code and own_causal):
        raise ConfigError(
            f"hf={source} is a {config.model_type} model, not a causal language model; "
            "pass a decoder (AutoModelForCausalLM: Llama, Qwen2, Mistral, GPT-NeoX, GPT-2, ...)"
        )
    dtype = torch.bfloat16 if device.type == "cuda" and precision == "bf16-mixed" else torch.float32
    try:
        # sdpa: fused kernels whose memory grows linearly with the length, where eager attention
        # stores every (heads × T × T) weight and a long evaluation would not fit. The attention
        # hook replaces it only within the forwards that ask for it.
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation="sdpa", **trust
        )
    except (ValueError, ImportError):
        # a model without an sdpa path: HF's default (eager for it); any other cause fails again
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **trust)
        except Exception as err:
            raise _load_failed(source, "weights", err) from None
    except Exception as err:
        raise _load_failed(source, "weights", err) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **trust)
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


# a wrapper's frequencies: fixed, or per window span (the kinds that read the length)
Frequencies = RotaryState | Callable[[int], RotaryState]


class PretrainedLM(nn.Module):
    """An HF causal LM, seen by the scorer as a poslab GPT (see module doc). Several instances
    (one per eval-time setting) share one HF model; each puts its frequencies in for its
    forward (`rotary`: fixed, a function of the window's span, or None: the model's own rotary
    module, as shipped), and `scheme` (the attention hook's, None: the model's own attention)
    is used within it."""

    def __init__(
        self,
        hf_model: nn.Module,
        source: str,
        rotary: Frequencies | None,
        scheme: Rotary | None = None,
    ) -> None:
        super().__init__()
        self.hf = hf_model
        self.source = source
        self.rotary = rotary
        self.scheme = scheme
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
        given = positions  # (T,) shared by the batch: the hook prepares them once, unexpanded
        rotary = self.rotary
        if callable(rotary):  # the window's span, as poslab's Rotary.prepare reads it
            span = int((positions.amax(dim=-1) - positions.amin(dim=-1)).max()) + 1
            rotary = rotary(span)
        if positions.dim() == 1:
            positions = positions.expand(idx.shape[0], -1)
        with self._frequencies(rotary), hooked(self.hf, self.scheme, given):
            out = self.hf.base_model(input_ids=idx, position_ids=positions, use_cache=False)
        return out.last_hidden_state

    @contextmanager
    def _frequencies(self, rotary: RotaryState | None) -> Iterator[None]:
        """`rotary`'s frequencies in the model's rotary modules for one forward (None: the
        modules' own, from a freshly loaded model's state); the ones found there come back
        after it (the hook's identity rotation never outlives it)."""
        modules = rotary_modules(self.hf)
        if rotary is None:
            with as_loaded(modules):
                yield
            return
        found = [(m.inv_freq, getattr(m, "attention_scaling", 1.0)) for m in modules]
        for module, inv_freq, factor in zip(
            modules, rotary.inv_freq, rotary.attention_scaling, strict=True
        ):
            module.inv_freq = inv_freq.to(module.inv_freq.device)
            module.attention_scaling = factor
        try:
            yield
        finally:
            for module, (inv_freq, factor) in zip(modules, found, strict=True):
                module.inv_freq, module.attention_scaling = inv_freq, factor

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.lm_head(self.hidden_states(idx, positions))


@contextmanager
def as_loaded(modules: list[nn.Module]) -> Iterator[None]:
    """Within: each rotary module that keeps state between forwards (HF's "dynamic" rope_type:
    its frequencies grow with the longest input seen and are kept until an input shorter than
    the context) starts from a freshly loaded model's state (its trained frequencies, its
    context as the longest input seen), so every window reads what a fresh model reads on it,
    in any order of lengths and batches; after: the state found comes back. longrope needs no
    reset: it picks its frequencies from the input alone (from original_inv_freq, never
    written here)."""
    stateful = [
        m
        for m in modules
        if "dynamic" in str(getattr(m, "rope_type", ""))
        and isinstance(getattr(m, "original_inv_freq", None), Tensor)
        and isinstance(getattr(m, "original_max_seq_len", None), int)
    ]
    keys = ("inv_freq", "original_inv_freq", "max_seq_len_cached", "attention_scaling")
    found = [{k: getattr(m, k) for k in keys if hasattr(m, k)} for m in stateful]
    for module in stateful:
        module.inv_freq = module.original_inv_freq.clone()  # HF may replace it, never ours
        module.max_seq_len_cached = module.original_max_seq_len
    try:
        yield
    finally:
        for module, state in zip(stateful, found, strict=True):
            for key, value in state.items():
                setattr(module, key, value)


def rotary_state(
    hf_model: nn.Module, source: str, scaling: RopeScaling | None, length: int
) -> RotaryState:
    """The frequencies of every rotary module at `length` under `scaling` (None: as trained)."""
    modules = rotary_modules(hf_model)
    original = [_trained_inv_freq(m) for m in modules]
    trained = [float(getattr(m, "attention_scaling", 1.0)) for m in modules]
    if scaling is None:
        return RotaryState(original, trained)
    _check_rescalable(hf_model, source, scaling, modules)
    base = _rope_base(hf_model.config)
    frequencies = []
    for inv_freq in original:
        rotary_dims = 2 * inv_freq.shape[-1]
        scaling.check_dims(rotary_dims)
        theta = scaling.theta(inv_freq, rotary_dims, length, base)
        frequencies.append(theta * scaling.position_scale)  # PI: m/s · θ = m · θ/s
    return RotaryState(frequencies, [scaling.attention_factor] * len(modules))


def by_span(hf_model: nn.Module, source: str, scaling: RopeScaling, length: int) -> Frequencies:
    """The frequencies of a kind that reads the length (dynamic_ntk, longrope) for each window's
    span, computed once per span; those at the nominal `length` now (checked before scoring)."""
    states = {length: rotary_state(hf_model, source, scaling, length)}

    def at(span: int) -> RotaryState:
        if span not in states:
            states[span] = rotary_state(hf_model, source, scaling, span)
        return states[span]

    return at


def _trained_inv_freq(module: nn.Module) -> Tensor:
    """A copy (never HF's buffer itself: a rotary that writes its buffers in place, as
    longrope's does, would write into the trained frequencies) of the module's trained ones."""
    return getattr(module, "original_inv_freq", module.inv_freq).detach().float().clone()


def _asked(scaling: RopeScaling) -> str:
    """The options the user set, as they set them: `eval.rope_scaling.kind=rerope and
    eval.logn_scaling=true`."""
    asked = [f"eval.rope_scaling.kind={scaling.kind}"] if scaling.kind != "none" else []
    return " and ".join(asked + (["eval.logn_scaling=true"] if scaling.logn else []))


def _undo(scaling: RopeScaling) -> str:
    undo = ["eval.rope_scaling.kind=none"] if scaling.kind != "none" else []
    return " and ".join(undo + (["eval.logn_scaling=false"] if scaling.logn else []))


def _check_rescalable(
    hf_model: nn.Module, source: str, scaling: RopeScaling, modules: list[nn.Module]
) -> None:
    """A rotary model with the default (unscaled) rotary, else one line."""
    if not modules:
        works = f"; it works on rotary models: {SERVED}" if needs_hook(scaling) else ""
        raise ConfigError(
            f"{_asked(scaling)}: hf={source} ({type(hf_model).__name__}) has no rotary "
            f"embedding module (inv_freq) to change{works}; set {_undo(scaling)}"
        )
    shipped = {str(getattr(m, "rope_type", "default")) for m in modules}
    if shipped - {"default"}:
        raise ConfigError(
            f"{_asked(scaling)}: hf={source} already ships rope_type="
            f"{','.join(sorted(shipped - {'default'}))}, which poslab's options would not "
            f"reproduce or would scale twice; set {_undo(scaling)} to evaluate it as shipped, "
            "or evaluate a copy whose config has the default rotary"
        )


def hooked_model(hf_model: nn.Module, source: str, scaling: RopeScaling) -> PretrainedLM:
    """The model under a kind that changes attention itself (`needs_hook`): its rotary module
    turns nothing (inv_freq = 0) and the attention hook rotates with poslab's scheme, θ the
    model's own frequencies."""
    modules = rotary_modules(hf_model)
    _check_rescalable(hf_model, source, scaling, modules)
    if len(modules) != 1:  # which module serves which layer is the model's own business
        raise ConfigError(
            f"{_asked(scaling)}: hf={source} ({type(hf_model).__name__}) has {len(modules)} "
            f"rotary embedding modules; the attention hook serves one per model: {SERVED}"
        )
    inv_freq = _trained_inv_freq(modules[0])
    scaling.check_dims(2 * inv_freq.shape[-1])
    scheme = hook_scheme(hf_model.config, inv_freq, _rope_base(hf_model.config), scaling)
    identity = RotaryState([torch.zeros_like(inv_freq)], [1.0])  # cos = 1, sin = 0 exactly
    return PretrainedLM(hf_model, source, identity, scheme)


def _rope_base(config: Any) -> float | None:
    params = getattr(config, "rope_parameters", None) or {}
    base = params.get("rope_theta") if isinstance(params, dict) else None
    return float(base or getattr(config, "rope_theta", 0) or 0) or None


def check_probe(model: PretrainedLM, device: torch.device) -> None:
    """poslab's scorer (final states × the output matrix) against the model's own logits on a
    short random probe: an output bias, a logit cap or scale makes them differ, and such a model
    is refused (its perplexities would be wrong)."""
    import torch.nn.functional as F

    from poslab.model.losses import linear_token_nll

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


def check_hook(model: PretrainedLM, context: int, device: torch.device, asked: str) -> None:
    """The attention hook against the model's own logits on the probe, with settings that
    change nothing (ReRoPE with its window over the whole probe: both score matrices and their
    merge run): a model whose attention it does not reproduce (another pairing of rotary dims,
    a norm or bias it does not know) is refused before any scoring."""
    probe = RopeScaling(kind="rerope", window=PROBE_TOKENS, train_length=context)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, PROBE_TOKENS), generator=generator).to(device)
    name = f"{asked}: hf={model.source} ({type(model.hf).__name__})"
    try:
        hooked = hooked_model(model.hf, model.source, probe)
        with torch.inference_mode():
            theirs = model(ids).float()
            ours = hooked(ids).float()
    except ConfigError:
        raise
    except Exception as err:  # an attention whose call the hook does not fit
        raise ConfigError(
            f"{name}: the attention hook cannot run in its attention ({type(err).__name__}: "
            f"{str(err).strip()[:120]}); it serves {SERVED}"
        ) from None
    if model.lm_head.weight.dtype == torch.float32:  # the two differ by rounding only
        gap = float((ours - theirs).abs().max())
        failed = gap > 1e-4 * max(1.0, float(theirs.abs().max()))
        what = f"largest gap {gap:.3g}"
    else:
        # with bf16 weights the two paths round q, k and the rotation differently in every
        # layer: the tests' tiny Llama, Qwen2 and GPT-NeoX measured 0.7% to 1.4% of the logits'
        # RMS on a CPU (also with 4 to 24 layers at HF's default init), where a model the hook
        # does not fit (Cohere's interleaved pairs) moves them by a third of it in two layers
        gap = float(rms(ours - theirs)) / max(float(rms(theirs)), 1e-6)
        failed = gap > BF16_PROBE_RMS
        what = f"RMS gap {gap:.3g} of the logits' RMS"
    if not math.isfinite(gap) or failed:
        raise ConfigError(
            f"{name}: the attention hook these options need does not reproduce its logits "
            f"({what}; another pairing of rotary dims, a norm it does not know?); "
            f"it serves {SERVED}"
        )


def rms(x: Tensor) -> Tensor:
    return x.float().pow(2).mean().sqrt()


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
    """length -> the model as evaluated there: as shipped (checked on the probe first), with
    the frequencies of the eval-time kind at that length (dynamic_ntk, longrope: at each
    window's span), or the attention hook with the kind (checked on the probe before its first
    use); one wrapper per distinct setting, all sharing the HF model."""
    plain = PretrainedLM(hf_model, source, None)  # as shipped: its own rotary, from a fresh state
    check_probe(plain, device)
    models: dict[int, PretrainedLM] = {}
    built: dict[str, PretrainedLM] = {}
    hook_checked = False
    for length in lengths:
        scaling = None
        if options is not None:
            factor = resolve_factor(options["kind"], options.get("factor", "auto"), length, context)
            scaling = RopeScaling(**{**options, "factor": factor, "train_length": context})
        if scaling is None or scaling.is_identity():
            models[length] = plain
            continue
        # dynamic_ntk and longrope read the length itself (each window's span): one wrapper
        # per length, whose nominal length is checked before scoring
        reads_length = scaling.reads_length
        key = f"{scaling!r}@{length if reads_length else ''}"
        if key in built:
            models[length] = built[key]
        elif needs_hook(scaling):
            built[key] = models[length] = hooked_model(hf_model, source, scaling)
            if not hook_checked:
                check_hook(plain, context, device, _asked(scaling))
                hook_checked = True
        else:
            state = (by_span if reads_length else rotary_state)(hf_model, source, scaling, length)
            built[key] = models[length] = PretrainedLM(hf_model, source, state)
    return models
