"""What a `-m` sweep does when its last job ends: compare the jobs' results.

A module of its own, because Hydra builds the callback when the sweep starts: importing it must
not import torch or the comparison code, which load only once the sweep is over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


class CompareOnMultirunEnd(Callback):
    """After a `-m` sweep, merge its jobs' results into <sweep>/comparison/, and where its jobs
    logged to W&B, log that comparison once, as a run of the jobs' group."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        from poslab.report.compare import compare, find_results
        from poslab.run.tracking import log_comparison, wandb_group

        sweep = Path(config.hydra.sweep.dir)
        if not find_results([sweep]):
            return
        compare([sweep], sweep / "comparison")
        # the keys W&B needs, one by one: the rest (the run's name) may interpolate what only
        # a job has
        keys = ("_target_", "project", "entity", "group", "offline", "init_timeout")
        logger = {k: OmegaConf.select(config, f"logger.{k}") for k in keys}
        group = wandb_group(logger, sweep.name)  # as each job's (tracking.build_logger)
        log_comparison(sweep / "comparison", logger, group, sweep.name)
