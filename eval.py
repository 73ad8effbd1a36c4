"""Perplexity beyond the training length: `python eval.py ckpt=PATH` (see conf/eval.yaml)."""

import hydra
from omegaconf import DictConfig

from poslab.cli import hydra_task, run_app


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@hydra_task(owns_folder=False)
def main(cfg: DictConfig) -> None:
    from poslab.evaluation.run import run_eval  # after Hydra: a typo fails without importing torch

    run_eval(cfg)


if __name__ == "__main__":
    run_app(main)
