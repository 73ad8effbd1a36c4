"""Tiny random Hugging Face causal LMs saved to folders, loaded back through the path a hub id
takes (`from_pretrained`): no hub, no network. A byte-level BPE tokenizer trained on the test
corpus goes with each model."""

from __future__ import annotations

from pathlib import Path

import torch

# the architectures eval.py hf= is tested on; `neox_partial` rotates half of each head
ARCHITECTURES = ("llama", "qwen2", "gpt_neox", "neox_partial", "gpt2")
CONTEXT = 32  # max_position_embeddings of every tiny model


def tokenizer_for(corpus: Path):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((corpus / "train.txt").read_text().splitlines(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def hf_config(arch: str, vocab_size: int, **rope: object):
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


def hf_model(arch: str, vocab_size: int, seed: int = 0, **rope: object):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config(arch, vocab_size, **rope)).eval()


def make_hf_models(root: Path, corpus: Path) -> dict[str, Path]:
    """arch -> a folder with a tiny random model and its tokenizer; also `bert` (attends both
    ways), `t5` (no causal LM class) and `no_weights` (a config and a tokenizer only)."""
    from transformers import BertConfig, BertLMHeadModel, T5Config

    tokenizer = tokenizer_for(corpus)
    folders = {}
    for arch in ARCHITECTURES:
        folder = root / arch
        hf_model(arch, len(tokenizer)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[arch] = folder
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
