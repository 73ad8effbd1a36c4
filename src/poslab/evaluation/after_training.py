"""The extrapolation evaluation as an after-training step of a training run.

conf/train.yaml names it under `after_training:`; training builds what that names, asks it to
check the run's config before any work (`check`), and calls it once training is done (on rank
0), so training needs no import of the evaluation. eval.after_train=false skips it. Its heavy
imports wait until it runs: the check before training must not import Lightning.
"""

from __future__ import annotations

from typing import Any


class EvaluateAfterTraining:
    """Score the trained model at every eval length (poslab.evaluation.run), into the run
    folder's extrapolation/ and the training run's W&B run."""

    def check(self, config: dict[str, Any], gpt_config: Any, scheme: Any, task: Any) -> None:
        """The evaluation planned from the run's config (see plan.check_before_training)."""
        if not config["eval"].get("after_train"):
            return
        from poslab.evaluation.plan import check_before_training

        check_before_training(config, gpt_config, scheme, task)

    def __call__(self, run: Any) -> None:
        """`run`: the finished training (poslab.run.training.FinishedRun)."""
        if not run.config.eval.after_train:
            return
        import torch

        from poslab.evaluation.run import evaluate_checkpoint

        # full fp32 matmuls (no TF32 on GPUs), so numbers match a later `eval.py`
        torch.set_float32_matmul_precision("highest")
        evaluate_checkpoint(
            run.checkpoint,
            run.config.eval,
            cache=run.cache,
            out_dir=run.out,
            wandb_run=run.wandb_run,
            trained_tokens=run.trained_tokens,
        )
