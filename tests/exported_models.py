"""Tiny poslab models of any scheme as the HF export takes them (tests/hf/): a run config, a GPT
with weights far from the init, a word-level tokenizer of its vocabulary."""

from __future__ import annotations

import copy
from typing import Any

import torch
from models import VOCAB, far_from_init, kernel_config
from tokenizers import Tokenizer, models, pre_tokenizers

from poslab.data.tokens import EOS, UNK
from poslab.model.build import build_model
from poslab.positions import scheme_configs

SEQ_LEN = 16  # L: 16x L is 256 tokens
CONFIGS = scheme_configs(SEQ_LEN)
__all__ = ["CONFIGS", "SEQ_LEN", "VOCAB", "run_config", "trained_looking", "word_tokenizer"]


def word_tokenizer() -> Tokenizer:
    vocab = {EOS: 0, UNK: 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def run_config(scheme: str, kernel: str, model_options: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"n_layer": 2, "n_head": 4, "d_model": 32, **model_options},
        "pos": copy.deepcopy(CONFIGS[scheme]),
        "attention": kernel_config(kernel),
        "data": {"seq_len": SEQ_LEN},
    }


def trained_looking(config: dict[str, Any]) -> torch.nn.Module:
    """The run's GPT with weights far from the init (std 0.2, positional parameters N(0, 1)), so
    that positions visibly change the logits (as tests/models.py's tiny_gpt)."""
    torch.manual_seed(0)
    return far_from_init(build_model(config, VOCAB))
