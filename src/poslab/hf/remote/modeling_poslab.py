"""A poslab GPT as a Hugging Face causal LM (written by poslab's export, poslab/hf/export.py):
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`. It needs torch and
transformers only: the model code beside this file is poslab's own (poslab_*.py), so the logits
are poslab's (tests/hf/test_remote_code.py holds them to 1e-5 at 1x, 4x and 16x L).

Generation keeps a key/value cache (poslab's KVCache: each layer's rotated keys, values and
decay) where the model allows one, and otherwise recomputes the whole sequence at every step,
which is right for every scheme and quadratic in the length; `cache_problem` says why a model
has none (linear attention, a score hook reading each layer's input as PaTH and GRAPE do, a
scheme that treats a token by the sequence's length as SSMax and xPos do). A batch of prompts
of unequal length is padded on the left (`tokenizer.padding_side = "left"`, the attention mask's
zeros in front): each sequence then generates what it generates alone (poslab's GPT
`left_padding`); padding on the right or inside a sequence is refused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_poslab import PoslabConfig
from .poslab_instantiate import instantiate_checked
from .poslab_model_gpt import GPT, GPTConfig, KVCache
from .poslab_modules import __doc__ as _modules  # noqa: F401 (every module, for the loader)
from .poslab_positions_rope_scaling import scaling_options

# model options of checkpoints older than the attention= group (poslab.model.build)
LEGACY_MODEL_KEYS = ("attention", "attn_block_size")
V5 = int(transformers.__version__.split(".")[0]) >= 5
# the output's cache field: `cache` from transformers 5.2x, `past_key_values` before
CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


def build_gpt(config: PoslabConfig) -> GPT:
    """The GPT of a run config, with the eval-time options of `config` (as eval.py builds it)."""
    gpt_config = gpt_config_of(config)
    return GPT(gpt_config, build_scheme(config), instantiate_checked(config.poslab["attention"]))


def gpt_config_of(config: PoslabConfig) -> GPTConfig:
    spec = config.poslab
    legacy = LEGACY_MODEL_KEYS
    options = {k: v for k, v in spec["model"].items() if not k.startswith("_") and k not in legacy}
    return GPTConfig(vocab_size=config.vocab_size, **options)


def build_scheme(config: PoslabConfig) -> torch.nn.Module:
    """The positional scheme, with eval.pos_overrides and eval.rope_scaling applied."""
    gpt_config = gpt_config_of(config)
    unknown = sorted(set(config.eval) - {"rope_scaling", "pos_overrides"})
    if unknown:
        raise ValueError(
            f"eval.{unknown[0]}: the exported model reads eval.rope_scaling and "
            "eval.pos_overrides only"
        )
    pos = {**config.poslab["pos"], **(config.eval.get("pos_overrides") or {})}
    rope_scaling = config.eval.get("rope_scaling")
    if rope_scaling:
        factor = rope_scaling.get("factor")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool):
            raise ValueError(
                f"eval.rope_scaling.factor={factor!r}: give a number (eval.py's `auto` follows "
                "each evaluated length, which a model loaded once cannot)"
            )
        length = config.train_length
        pos = {**pos, "scaling": scaling_options(dict(rope_scaling), pos, length, length)}
    sizes = {"d_model": gpt_config.d_model, "n_head": gpt_config.n_head}
    # HF builds the model on the meta device; some schemes compute their derived state from
    # real numbers when built (HoPE's and p-RoPE's cut), and they are small
    with torch.device("cpu"):
        return instantiate_checked(pos, **sizes, n_layer=gpt_config.n_layer)


def left_padding(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The padding in front of each sequence (B,) of an attention mask (B, T) (1: a token, 0:
    padding), None without one; a ValueError for padding anywhere but in front."""
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    padding = (~mask).sum(dim=1)
    in_front = torch.arange(mask.shape[1], device=mask.device)[None, :] >= padding[:, None]
    if not torch.equal(mask, in_front):
        raise ValueError(
            "this poslab model takes padding on the left only (the attention mask's zeros in "
            "front of each sequence): set tokenizer.padding_side = 'left'"
        )
    return padding


class PoslabPreTrainedModel(PreTrainedModel):
    config_class = PoslabConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Every weight comes from the folder; derived buffers (θ, slopes) are built from the
        config by the modules themselves."""


class PoslabModel(PoslabPreTrainedModel):
    """The network up to the final norm (HF's base model): `last_hidden_state`, the states the
    tied output layer turns into logits (what eval.py hf= scores, fused with the loss)."""

    def __init__(self, config: PoslabConfig) -> None:
        super().__init__(config)
        self.poslab = build_gpt(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """Final normalised states of `input_ids` (at `position_ids`, else 0..T−1)."""
        return BaseModelOutputWithPast(
            last_hidden_state=self.poslab.hidden_states(input_ids, position_ids)
        )


class PoslabForCausalLM(PoslabPreTrainedModel, GenerationMixin):
    _tied_weights_keys = (
        {"model.poslab.lm_head.weight": "model.poslab.tok_emb.weight"}
        if V5
        else ["model.poslab.lm_head.weight"]
    )

    def __init__(self, config: PoslabConfig) -> None:
        super().__init__(config)
        self.model = PoslabModel(config)
        self.post_init()
        self.cache_problem: str | None = None  # set once the weights are in (from_pretrained)

    @property
    def poslab(self) -> GPT:
        return self.model.poslab

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> PoslabForCausalLM:
        model = super().from_pretrained(*args, **kwargs)
        model.rebuild_derived_buffers()
        model.cache_problem = model.poslab.cache_problem()
        return model

    def rebuild_derived_buffers(self) -> None:
        """A scheme's derived state (a fixed θ, ALiBi's slopes) lives in non-persistent
        buffers, computed from the config when the scheme is built; the folder does not hold
        them and HF's loader leaves them unset (it builds the model on the meta device), so
        they are computed again here."""
        fresh = build_scheme(self.config)
        device = self.poslab.tok_emb.weight.device
        persistent = set(fresh.state_dict())
        for name, buffer in fresh.named_buffers():
            if name in persistent:
                continue
            owner, _, leaf = name.rpartition(".")
            module = self.poslab.pos.get_submodule(owner)
            module._buffers[leaf] = buffer.to(device)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.poslab.tok_emb

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.poslab.lm_head

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits of `input_ids`; with `use_cache` (where the model allows a cache), the new
        tokens after those of `cache` (`past_key_values` in transformers before 5.2x; a
        KVCache), which comes back extended."""
        given = cache if cache is not None else past_key_values
        cache = None
        if use_cache and self.cache_problem is None and labels is None:
            cache = given if isinstance(given, KVCache) else self.poslab.new_cache()
        padding = left_padding(attention_mask)
        logits = self.poslab(input_ids, cache=cache, left_padding=padding)
        loss = None
        if labels is not None:  # next-token loss, as HF's causal LMs compute it
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The tokens after the cached ones (all of them without a cache)."""
        given = cache if cache is not None else past_key_values
        cached = given.length if isinstance(given, KVCache) else 0
        return {
            "input_ids": input_ids[:, cached:],
            "attention_mask": attention_mask,
            CACHE_FIELD: given,
            "use_cache": use_cache,
        }
