"""Language-model training data: contiguous windows of a cached, tokenized corpus, and the
Lightning data module that serves them (training batches in a resumable order, sampling.py)."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from poslab.data.cache import TokenCache
from poslab.data.sampling import ResumableLoader, run_batches
from poslab.errors import ConfigError


class TokenWindows(Dataset):
    """Contiguous, non-overlapping windows: input ids[i·L : i·L+L], target shifted by one."""

    def __init__(self, ids: np.ndarray, seq_len: int, split: str = "train") -> None:
        if len(ids) < seq_len + 1:
            raise ConfigError(
                f"data.seq_len={seq_len} is longer than the {split} split ({len(ids)} tokens); "
                "lower data.seq_len or use a larger corpus"
            )
        self.ids = ids
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        chunk = torch.from_numpy(np.asarray(self.ids[start : start + self.seq_len + 1], np.int64))
        return chunk[:-1], chunk[1:]


def _split_source(meta: dict, split: str) -> tuple[str, str]:
    """(where a split's tokens come from, how to give it more) for an error message."""
    settings = meta.get("settings", {})
    file = meta.get("inputs", {}).get("files", {}).get(split)
    fraction = settings.get("valid_fraction")
    if split == "validation" and fraction and not file:  # held out from the end of train
        return f"the last data.valid_fraction={fraction} of train", "raise data.valid_fraction"
    source = file["path"] if file else str(settings.get("path") or settings.get("hub_id"))
    return source, f"give the {split} split more text"


class LMDataModule(L.LightningDataModule):
    """Train/validation windows of `seq_len` tokens from a cached, tokenized corpus; the corpus
    and tokenizer settings (`corpus`) are TokenCache's arguments."""

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        word_level: bool = False,
        seed: int = 0,
        **corpus: Any,
    ) -> None:
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ConfigError(
                f"data.seq_len={seq_len} and data.batch_size={batch_size} must be ≥ 1"
            )
        self.cache = TokenCache(**corpus)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.word_level = word_level
        self.seed = seed  # fixes the order of training batches (poslab.data.sampling)

    @property
    def vocab_size(self) -> int:
        return int(self.meta()["vocab_size"])

    def meta(self) -> dict:
        """The token cache's meta.json (built first if need be), checked to give every split
        the model trains or validates on at least one window of data.seq_len tokens: read
        before the Trainer is built, so a short split fails before any work."""
        meta = self.cache.meta()
        for split in ("train", "validation"):
            tokens = meta["splits"].get(split, {}).get("tokens")
            if tokens is not None and tokens < self.seq_len + 1:  # input and shifted target
                source, more = _split_source(meta, split)
                raise ConfigError(
                    f"the {split} split ({source}) has {tokens} tokens, fewer than the "
                    f"data.seq_len={self.seq_len} + 1 of one window; lower data.seq_len to at "
                    f"most {max(tokens - 1, 1)} or {more}"
                )
        return meta

    def prepare_data(self) -> None:
        self.meta()

    def setup(self, stage: str | None = None) -> None:
        self.train_set = TokenWindows(self.cache.split("train").ids, self.seq_len, "train")
        self.val_set = TokenWindows(self.cache.split("validation").ids, self.seq_len, "validation")

    def train_dataloader(self) -> DataLoader:
        """The run's batches in a resumable order (poslab.data.sampling): one stream of
        max_steps × accumulation batches, starting at the batch the run has reached."""
        # outside a Trainer: one data epoch from the start
        batches = run_batches(
            self.trainer,
            len(self.train_set),
            self.batch_size,
            self.seed,
            untrained_batches=len(self.train_set) // self.batch_size,
        )
        return ResumableLoader(
            self.train_set,
            batches,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        sampler = None
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:  # each rank validates its part
            sampler = DistributedSampler(
                self.val_set, trainer.world_size, trainer.global_rank, shuffle=False
            )
        return DataLoader(
            self.val_set,
            batch_size=self.eval_batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
        )
