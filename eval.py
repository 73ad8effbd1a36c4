"""Perplexity beyond the training length: `python eval.py ckpt=PATH` (see conf/eval.yaml)."""

import hydra
from omegaconf import DictConfig

from poslab.errors import exit_on_config_error
from poslab.evaluation.run import run_eval


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@exit_on_config_error
def main(cfg: DictConfig) -> None:
    run_eval(cfg)


if __name__ == "__main__":
    main()
