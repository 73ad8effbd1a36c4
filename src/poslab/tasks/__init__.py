"""Generated tasks whose answer lies far back (passkey, associative recall, copy, reverse), as
Lightning data modules: `python train.py data=passkey pos=alibi`.

Examples are made on the fly from (seed, split, index), so there is nothing to download or
cache, a run resumes on exactly the examples it would have seen, and the validation examples are
never training ones. `loss_on=answer` trains on the answer tokens only (the task's signal; the
filler of a passkey example is not worth learning), `loss_on=all` on every non-padding token.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from poslab.data.sampling import ResumableLoader, run_batches
from poslab.errors import ConfigError
from poslab.losses import IGNORE_INDEX
from poslab.tasks.base import Example, Task, example_rng, score

__all__ = ["Example", "Task", "TaskDataModule", "TaskExamples", "example_rng", "score"]

# the stream of each split in the examples' generator seeds (poslab.tasks.base.example_rng)
TRAIN, VALIDATION, EVALUATION = 0, 1, 2
LOSS_ON = ("answer", "all")


def targets_of(example: Example, loss_on: str) -> torch.Tensor:
    """The targets the loss reads: the answer tokens (loss_on=answer) or every token but
    padding (all); the rest are IGNORE_INDEX."""
    targets = torch.from_numpy(example.targets.copy())
    keep = example.answer if loss_on == "answer" else ~example.padding
    targets[~torch.from_numpy(keep)] = IGNORE_INDEX
    return targets


class TaskExamples(Dataset):
    """`count` examples of `length` tokens; example i is made from (seed, stream, i)."""

    def __init__(
        self,
        task: Task,
        length: int,
        count: int,
        seed: int,
        stream: int,
        loss_on: str = "answer",
        train: bool = False,
        condition: dict | None = None,
    ) -> None:
        self.task, self.length, self.count = task, length, count
        self.seed, self.stream, self.loss_on = seed, stream, loss_on
        self.train, self.condition = train, condition

    def __len__(self) -> int:
        return self.count

    def example(self, i: int) -> Example:
        rng = example_rng(self.seed, self.stream, self.length, i)
        return self.task.example(self.length, rng, self.condition, train=self.train)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        """(inputs, targets), and the inputs' positions (T, A) for a task with position axes."""
        example = self.example(i)
        inputs = torch.from_numpy(example.tokens[:-1].copy())
        if example.positions is None:
            return inputs, targets_of(example, self.loss_on)
        positions = torch.from_numpy(example.positions[:-1].copy())
        return inputs, targets_of(example, self.loss_on), positions


def evaluation_batches(
    task: Task, length: int, examples: int, seed: int
) -> list[tuple[dict | None, list[Example]]]:
    """What an evaluation scores at `length`: `examples` fresh examples under each of the
    task's conditions, as (condition, examples); the same for the model and its baselines."""
    batches = []
    for c, condition in enumerate(task.conditions()):
        made = TaskExamples(task, length, examples, seed, EVALUATION, condition=condition)
        batches.append((condition, [made.example(c * examples + i) for i in range(examples)]))
    return batches


class TaskDataModule(L.LightningDataModule):
    """Train/validation examples of a generated task at the training length `seq_len`."""

    def __init__(
        self,
        task: Task,
        seq_len: int,
        batch_size: int,
        loss_on: str = "answer",
        val_examples: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        name: str | None = None,
        word_level: bool = False,
        position_axes: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(task, Task):
            raise ConfigError(
                f"data.task must build a poslab.tasks Task (got {type(task).__name__}); "
                "pick one with data=passkey|assoc_recall|copy|reverse"
            )
        if loss_on not in LOSS_ON:
            raise ConfigError(f"data.loss_on={loss_on} must be one of {', '.join(LOSS_ON)}")
        if seq_len < 1 or batch_size < 1 or val_examples < 1:
            raise ConfigError(
                f"data.seq_len={seq_len}, data.batch_size={batch_size} and "
                f"data.val_examples={val_examples} must be ≥ 1"
            )
        task.check_length(seq_len)
        if position_axes is not None and position_axes != task.position_axes:
            raise ConfigError(
                f"data.position_axes={position_axes} but the {task.name} task gives "
                f"{task.position_axes} per token; set data.position_axes={task.position_axes}"
            )
        self.task = task
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.loss_on = loss_on
        self.val_examples = val_examples
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.seed = seed

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size

    @property
    def position_axes(self) -> int:
        return self.task.position_axes

    def setup(self, stage: str | None = None) -> None:
        self.val_set = TaskExamples(
            self.task, self.seq_len, self.val_examples, self.seed, VALIDATION, self.loss_on
        )

    def train_dataloader(self) -> DataLoader:
        """A fresh example for every slot of the run (never repeated), in a resumable order."""
        trainer = self.trainer
        total = trainer.max_steps * trainer.accumulate_grad_batches if trainer else 1000
        world = trainer.world_size if trainer else 1
        train_set = TaskExamples(
            self.task,
            self.seq_len,
            total * self.batch_size * world,
            self.seed,
            TRAIN,
            self.loss_on,
            train=True,
        )
        batches = run_batches(trainer, len(train_set), self.batch_size, self.seed, total)
        return ResumableLoader(
            train_set,
            batches,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.eval_batch_size)


def build_task(data_config: dict[str, Any]) -> Task:
    """The task of a run's data config (a checkpoint's, at evaluation)."""
    from hydra.utils import instantiate

    return instantiate(data_config["task"])
