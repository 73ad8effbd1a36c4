"""Generated tasks whose answer lies far back (passkey, associative recall, copy, reverse), as
Lightning data modules: `python train.py data=passkey pos=alibi`.

Examples are made on the fly from (seed, split, index), so there is nothing to download or
cache, a run resumes on exactly the examples it would have seen, and the validation examples are
never training ones. `loss_on=answer` trains on the answer tokens only (the task's signal; the
filler of a passkey example is not worth learning), `loss_on=all` on every non-padding token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from poslab.targets import IGNORE_INDEX
from poslab.tasks.base import Example, Task, example_rng, score

__all__ = ["Example", "Task", "TaskDataModule", "TaskExamples", "example_rng", "score"]


def __getattr__(name: str) -> Any:
    """TaskDataModule (poslab.tasks.datamodule) is imported when first asked for: the checks that
    run before any work (and a study's dry run) need the tasks, not Lightning's seconds of
    imports. Configs and checkpoints name it `poslab.tasks.TaskDataModule`."""
    if name == "TaskDataModule":
        from poslab.tasks.datamodule import TaskDataModule

        return TaskDataModule
    raise AttributeError(f"module 'poslab.tasks' has no attribute {name!r}")


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


def build_task(data_config: dict[str, Any]) -> Task:
    """The task of a run's data config (a checkpoint's, at evaluation)."""
    from hydra.utils import instantiate

    return instantiate(data_config["task"])
