"""Corpus loading (Hugging Face `datasets`), tokenizers (`tokenizers`), cached token ids, windows.

A corpus is read once through `datasets` (from the hub by id, or from local split files:
corpus.py), a tokenizer is trained on its train split (tokens.py), and every split's token ids
are written to a cache folder keyed by the corpus and tokenizer settings (cache.py), so a second
run starts in seconds. Training reads contiguous windows of them (text.py) in a resumable batch
order (sampling.py).

Code in poslab imports from those modules. This one re-exports only the data module that Hydra
configs (conf/data/*.yaml) and the configs saved in checkpoints name by its `_target_`,
`poslab.data.LMDataModule`: checkpoints written before the package was split must keep
resolving. It is imported when first asked for (PEP 562): the checks that need only the
tokenizer's options (tokens.py) must not wait seconds for Lightning.
"""

from typing import Any

__all__ = ["LMDataModule"]


def __getattr__(name: str) -> Any:
    if name == "LMDataModule":
        from poslab.data.text import LMDataModule

        return LMDataModule
    raise AttributeError(f"module 'poslab.data' has no attribute {name!r}")
