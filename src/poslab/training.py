"""`python train.py ...`: build data, model, logger and Trainer from the Hydra config and fit."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf

from poslab.build import instantiate_checked
from poslab.lit import LanguageModel

log = logging.getLogger(__name__)


def default_precision() -> str:
    """bf16 autocast where a GPU supports it, full fp32 otherwise (override with
    trainer.precision=bf16-mixed on a CPU: these run bf16 matmuls faster)."""
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "32-true"


OmegaConf.register_new_resolver("poslab.default_precision", default_precision, replace=True)


def run_dir() -> Path:
    """This job's output folder (Hydra's), or the current folder outside Hydra."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def sweep_group() -> str | None:
    """In a `-m` sweep, the sweep folder's name, so all its jobs share one W&B group."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return None


def wandb_offline(setting: bool | None) -> bool:
    """Explicit setting wins; else WANDB_MODE; else online only when credentials exist."""
    if setting is not None:
        return bool(setting)
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode != "online"
    if os.environ.get("WANDB_API_KEY"):
        return False
    netrc = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    return not (netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"))


def build_logger(config: dict[str, Any], out: Path) -> Any:
    """The configured Lightning logger (False for logger=none). For W&B the group is resolved
    here and written back into `config`, so checkpoints (and eval.py) know it."""
    logger_cfg = dict(config.get("logger") or {})
    if not logger_cfg:
        return False
    kwargs: dict[str, Any] = {"save_dir": str(out)}
    if logger_cfg["_target_"].endswith("WandbLogger"):
        offline = wandb_offline(logger_cfg.pop("offline", None))
        logger_cfg["group"] = logger_cfg.get("group") or sweep_group() or config.get("run_name")
        config["logger"]["group"] = logger_cfg["group"]
        # each job of a sweep is its own W&B run; the resolved config arrives through the
        # LightningModule's hyperparameters
        kwargs.update(offline=offline, reinit="finish_previous")
    return instantiate_checked(logger_cfg, **kwargs)


def max_steps_for(cfg: DictConfig) -> int:
    """trainer.max_steps, or the steps that spend train.max_tokens (optimizer steps: batch ×
    seq_len × gradient accumulation × devices tokens each)."""
    devices = cfg.trainer.get("devices", 1)
    tokens_per_step = (
        cfg.data.batch_size
        * cfg.data.seq_len
        * cfg.trainer.get("accumulate_grad_batches", 1)
        * (devices if isinstance(devices, int) else 1)
    )
    if cfg.train.get("max_tokens"):
        return math.ceil(cfg.train.max_tokens / tokens_per_step)
    return int(cfg.trainer.max_steps)


def run_training(cfg: DictConfig) -> dict[str, float]:
    """Fit one model; returns the final metrics (also what a Hydra sweeper would optimise)."""
    out = run_dir()
    L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision("high")
    config = OmegaConf.to_container(cfg, resolve=True)

    datamodule = instantiate_checked(cfg.data)
    vocab_size = datamodule.vocab_size
    logger = build_logger(config, out)
    module = LanguageModel(config, vocab_size)
    # fail before training, not at step N, if the scheme cannot cover the training length
    module.model.pos.check_length(cfg.data.seq_len - 1)
    log.info(
        "pos=%s model=%s: %.2fM non-embedding parameters, vocab %d, seq_len %d",
        cfg.pos_name,
        cfg.model_name,
        module.model.num_parameters() / 1e6,
        vocab_size,
        cfg.data.seq_len,
    )

    max_steps = max_steps_for(cfg)
    checkpoint = ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_cfg.update(
        max_steps=max_steps,
        val_check_interval=min(int(trainer_cfg.get("val_check_interval", max_steps)), max_steps),
        check_val_every_n_epoch=None,
        default_root_dir=str(out),
    )
    trainer: L.Trainer = instantiate_checked(trainer_cfg, logger=logger, callbacks=[checkpoint])

    try:
        metrics: dict[str, float] = {}
        if cfg.train.validate_before_fit:
            # the step-0 baseline, so "validation loss falls" is visible in every log
            (initial,) = trainer.validate(module, datamodule=datamodule, verbose=False)
            metrics["val/loss_initial"] = initial["val/loss"]
        trainer.fit(module, datamodule=datamodule)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1})
        metrics["best_val_loss"] = float(checkpoint.best_model_score or float("nan"))
        log.info("best checkpoint: %s", checkpoint.best_model_path)
        if "val/loss_initial" in metrics:
            log.info(
                "val/loss %.4f at step 0 -> %.4f best",
                metrics["val/loss_initial"],
                metrics["best_val_loss"],
            )

        if cfg.eval.after_train and trainer.is_global_zero:
            from poslab.evaluation.run import evaluate_checkpoint

            # full fp32 matmuls (no TF32 on GPUs), so numbers match a later `eval.py`
            torch.set_float32_matmul_precision("highest")
            evaluate_checkpoint(
                checkpoint.best_model_path or checkpoint.last_model_path,
                cfg.eval,
                cache=datamodule.cache,
                out_dir=out,
                wandb_run=logger.experiment if isinstance(logger, WandbLogger) else None,
            )
    finally:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            # finish even after a crash: the next job of a sweep must start its own W&B run
            logger.experiment.finish()
    return metrics
