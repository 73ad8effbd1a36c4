"""Tiny random Hugging Face causal LMs saved to folders, loaded back through the path a hub id
takes (`from_pretrained`): no hub, no network. A byte-level BPE tokenizer trained on the test
corpus goes with each model. The models themselves are poslab.hf.tiny_hf's (the parity report,
scripts/pretrained_parity.py, measures the same ones); their names are re-exported here."""

from __future__ import annotations

from pathlib import Path

from poslab.hf.tiny_hf import ARCHITECTURES, CONTEXT, hf_config, hf_model, save_tiny, tokenizer_for

__all__ = ["ARCHITECTURES", "CONTEXT", "hf_config", "hf_model", "make_hf_models", "tokenizer_for"]


def make_hf_models(root: Path, corpus: Path) -> dict[str, Path]:
    """arch -> a folder with a tiny random model and its tokenizer; also `bert` (attends both
    ways), `t5` (no causal LM class) and `no_weights` (a config and a tokenizer only)."""
    from transformers import BertConfig, BertLMHeadModel, T5Config

    tokenizer = tokenizer_for(corpus)
    folders = {arch: save_tiny(arch, root / arch, tokenizer) for arch in ARCHITECTURES}
    bert = root / "bert"  # an encoder: BertLMHeadModel loads it, attending both ways
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4
    )
    BertLMHeadModel(config).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    t5 = root / "t5"  # an encoder-decoder: no causal LM class at all
    T5Config(vocab_size=len(tokenizer), d_model=32, num_layers=1).save_pretrained(t5)
    tokenizer.save_pretrained(t5)
    folders["t5"] = t5
    folders["bert"] = bert
    bare = root / "no_weights"
    hf_config("llama", len(tokenizer)).save_pretrained(bare)
    tokenizer.save_pretrained(bare)
    folders["no_weights"] = bare
    return folders
