"""Optional Lightning callbacks of the harness.

`RankFingerprints` (`++train.fingerprints=true`) makes a multi-process run checkable after the
fact: every rank writes `<run>/fingerprints/rank<k>.json` with digests of the training batches
it saw and of its parameters at the start and end of training. In a correct data-parallel run
the ranks saw different batches (Lightning's DistributedSampler gives each rank its own part of
every epoch) and end with identical parameters (DDP averages gradients, so all ranks take the
same optimizer steps). Digests are exact (SHA-256 of the raw bytes), so "identical" is bitwise.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch


def tensor_digest(named: list[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes, in name order (any dtype, bf16 too)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class RankFingerprints(L.Callback):
    """Writes `<folder>/rank<global rank>.json` when training ends: world size, step, batches,
    samples and tokens this rank trained on, a digest of each training batch (inputs, in order,
    12 hex digits: ~2 MB of JSON per 100k batches) and of all of them, and digests of the
    parameters and buffers at the start and end of training.

    It copies every batch to the CPU, which costs a little throughput on GPUs: a tool for
    checking a setup, off by default. Under FSDP a rank holds only its shards of the
    parameters, so its parameter digests describe those shards.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.batch_digests: list[str] = []
        # a hex string, not a hashlib object: ddp_spawn pickles callbacks into its processes
        self.all_batches = hashlib.sha256().hexdigest()
        self.samples = 0
        self.tokens = 0
        self.params_start: str | None = None

    @staticmethod
    def _state(module: L.LightningModule) -> list[tuple[str, torch.Tensor]]:
        return [*module.named_parameters(), *module.named_buffers()]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.params_start = tensor_digest(self._state(pl_module))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        inputs = batch[0].detach().to("cpu").contiguous()
        digest = hashlib.sha256(inputs.numpy().tobytes()).hexdigest()
        self.batch_digests.append(digest[:12])
        self.all_batches = hashlib.sha256((self.all_batches + digest).encode()).hexdigest()
        self.samples += int(inputs.shape[0])
        self.tokens += int(inputs.numel())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        record = {
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "batches": len(self.batch_digests),
            "samples": self.samples,
            "tokens": self.tokens,
            "batches_digest": self.all_batches,
            "params_start": self.params_start,
            "params_end": tensor_digest(self._state(pl_module)),
            "batch_digests": self.batch_digests,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(record, indent=1))
