"""The configuration of a poslab model exported as a Hugging Face model (written by poslab's
export, poslab/hf/export.py; needs torch and transformers only).

`poslab` holds the run's network as poslab recorded it: `model` (GPTConfig's options), `pos`
(the positional scheme's `_target_` and options) and `attention` (the kernel's). `eval` holds
eval.py's eval-time options under their eval.py names, read when the model is built, so they can
be set in config.json or passed to from_pretrained (`eval={"rope_scaling": {...}}`):

* `eval.rope_scaling`: a RoPE extension of a rotary scheme, e.g. {"kind": "yarn", "factor": 4}
  with the kind's own options beside (absent or null: as trained);
* `eval.pos_overrides`: options of the scheme that keep its weights, e.g.
  {"beyond_table": "clamp"} for a learned table.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class PoslabConfig(PretrainedConfig):
    model_type = "poslab"

    def __init__(
        self,
        poslab: dict[str, Any] | None = None,
        vocab_size: int = 1,
        train_length: int = 0,
        eval: dict[str, Any] | None = None,  # noqa: A002 (eval.py's name)
        **kwargs: Any,
    ) -> None:
        self.poslab = poslab or {}
        self.vocab_size = vocab_size
        self.train_length = train_length  # L, the run's data.seq_len
        self.eval = dict(eval or {})
        model = self.poslab.get("model", {})
        self.hidden_size = model.get("d_model", 0)
        self.num_hidden_layers = model.get("n_layer", 0)
        self.num_attention_heads = model.get("n_head", 0)
        # what eval.py hf= and lm-evaluation-harness read as the model's context: its L (the
        # scheme, not this number, says how far it reads)
        self.max_position_embeddings = train_length
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)
