"""Train a GPT with one positional scheme: `python train.py pos=rope` (see conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from poslab.errors import exit_on_config_error
from poslab.training import run_training


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exit_on_config_error
def main(cfg: DictConfig) -> float:
    return run_training(cfg)["best_val_loss"]


if __name__ == "__main__":
    main()
