"""The Lightning data module of a generated task (`_target_: poslab.tasks.TaskDataModule`)."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from poslab.data.sampling import ResumableLoader, run_batches
from poslab.errors import ConfigError
from poslab.tasks import LOSS_ON, TRAIN, VALIDATION, TaskExamples
from poslab.tasks.base import Task


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
