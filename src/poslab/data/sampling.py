"""The order of training batches as a pure function of (seed, batch index): resumable exactly.

A whole run is one stream of batches. Data epoch e is a permutation of the training windows
drawn from a generator seeded with (seed, e); batch b of the run takes, on rank r of W, the
windows perm[(i·W + r)·B : (i·W + r + 1)·B] of epoch e = b // per_epoch, i = b % per_epoch. The
stream starts at the batch the run has reached (the optimizer steps taken × accumulation), so a
run resumed from a checkpoint sees exactly the batches an uninterrupted run would have seen, and
every rank of a data-parallel run sees its own part of each batch (no DistributedSampler).

The loader reports the run's full length to Lightning, whose progress counters (restored from
the checkpoint) count from the start of the run; the stream then ends when the run does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from poslab.errors import ConfigError


class RunBatches(Sampler[list[int]]):
    """Batches of window indices for batches start() .. total_batches-1 of a run."""

    def __init__(
        self,
        num_windows: int,
        batch_size: int,
        seed: int,
        total_batches: int,
        start: Callable[[], int] = lambda: 0,
        rank: int = 0,
        world_size: int = 1,
        accumulate: int = 1,
    ) -> None:
        self.per_epoch = num_windows // (batch_size * world_size)
        if self.per_epoch < 1:
            raise ConfigError(
                f"the train split has {num_windows} windows, fewer than one batch of "
                f"{batch_size} × {world_size} processes; lower data.batch_size or data.seq_len"
            )
        self.num_windows = num_windows
        self.batch_size = batch_size
        self.seed = seed
        self.total_batches = total_batches
        self.start = start
        self.rank = rank
        self.world_size = world_size
        self.accumulate = accumulate  # the start is counted in steps × accumulation

    def __len__(self) -> int:
        return self.total_batches

    def permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_windows, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, perm = -1, torch.empty(0, dtype=torch.long)
        for b in range(self.start(), self.total_batches):
            e, i = divmod(b, self.per_epoch)
            if e != epoch:
                epoch, perm = e, self.permutation(e)
            first = (i * self.world_size + self.rank) * self.batch_size
            yield perm[first : first + self.batch_size].tolist()


def run_batches(
    trainer: Any, num_windows: int, batch_size: int, seed: int, untrained_batches: int
) -> RunBatches:
    """The batch stream of a run under `trainer` (max_steps × accumulation batches, starting at
    the batch the run has reached, this rank's part of each); without a Trainer,
    `untrained_batches` batches from the start."""
    if trainer is None:
        return RunBatches(num_windows, batch_size, seed, untrained_batches)
    accumulate = trainer.accumulate_grad_batches
    return RunBatches(
        num_windows,
        batch_size,
        seed,
        total_batches=trainer.max_steps * accumulate,
        start=lambda: trainer.global_step * accumulate,
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        accumulate=accumulate,
    )


class ResumableLoader(DataLoader):
    """A DataLoader over RunBatches that Lightning treats as resumable (it has state_dict and
    load_state_dict). Its position comes from the restored step count, so the state it saves is
    the settings that fix the order: resuming with other settings is an error, not a silently
    different run."""

    def __init__(self, dataset: Dataset, batches: RunBatches, **kwargs: Any) -> None:
        super().__init__(dataset, batch_sampler=batches, **kwargs)
        self.batches = batches

    def state_dict(self) -> dict[str, Any]:
        b = self.batches
        return {
            "seed": b.seed,
            "batch_size": b.batch_size,
            "num_windows": b.num_windows,
            "world_size": b.world_size,
            "accumulate": b.accumulate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        now = self.state_dict()
        changed = [f"{k} {state[k]} -> {now[k]}" for k in now if k in state and state[k] != now[k]]
        if changed:
            raise ConfigError(
                f"the checkpoint's data order differs from this run's ({', '.join(changed)}); "
                "resume with the seed, data.batch_size, data.seq_len, "
                "trainer.accumulate_grad_batches and process count it was trained with"
            )
