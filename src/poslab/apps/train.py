"""Train a GPT with one positional scheme: `python train.py pos=rope` or `poslab-train pos=rope`
(the config: poslab/conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from poslab.run.cli import hydra_task, run_app
from poslab.run.extend import inherit_parent
from poslab.run.validate import check_run_config


@hydra.main(version_base="1.3", config_path="pkg://poslab.conf", config_name="train")
@hydra_task(owns_folder=True)
def main(cfg: DictConfig) -> float:
    # before Lightning is imported: bad input fails in about a second
    parent = inherit_parent(cfg)  # extend=RUN: the parent's architecture, checked
    after_training = check_run_config(cfg)
    from poslab.run.training import run_training

    return run_training(cfg, after_training, parent)["best_val_loss"]


def entry() -> None:
    run_app(main, resumable=True)


if __name__ == "__main__":
    entry()
