"""`python train.py ...`: build data, model, logger and Trainer from the Hydra config and fit."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from omegaconf import DictConfig, OmegaConf

from poslab.build import instantiate_checked, read_checkpoint
from poslab.callbacks import AtomicCheckpointIO, LastCheckpoint, RankFingerprints
from poslab.cli import log_to_file, run_dir, write_status
from poslab.errors import ConfigError, TrainingDiverged
from poslab.lit import LanguageModel
from poslab.precision import device_type_of, resolve_precision
from poslab.validate import check_run_config

log = logging.getLogger(__name__)


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


def build_logger(config: dict[str, Any], out: Path, wandb_id: str | None = None) -> Any:
    """The configured Lightning logger (False for logger=none). For W&B the group is resolved
    here and written back into `config`, so checkpoints (and eval.py) know it; a resumed run
    continues its W&B run (`wandb_id`). W&B is started here, with a bounded wait: if it cannot
    start online (no network, bad credentials), the run goes on with an offline W&B run."""
    logger_cfg = dict(config.get("logger") or {})
    if not logger_cfg:
        return False
    kwargs: dict[str, Any] = {"save_dir": str(out)}
    if not logger_cfg["_target_"].endswith("WandbLogger"):
        return instantiate_checked(logger_cfg, **kwargs)
    offline = wandb_offline(logger_cfg.pop("offline", None))
    timeout = float(logger_cfg.pop("init_timeout", 60))
    logger_cfg["group"] = logger_cfg.get("group") or sweep_group() or config.get("run_name")
    config["logger"]["group"] = logger_cfg["group"]
    # each job of a sweep is its own W&B run; the resolved config arrives through the
    # LightningModule's hyperparameters
    kwargs.update(reinit="finish_previous")
    if wandb_id:
        kwargs.update(id=wandb_id, resume="allow")
    if not offline:
        import wandb

        kwargs["settings"] = wandb.Settings(init_timeout=timeout)
        logger = instantiate_checked(logger_cfg, offline=False, **kwargs)
        try:
            logger.experiment  # noqa: B018 -- starts the W&B run now, within init_timeout
            return logger
        except Exception as err:  # wandb raises many types (CommError, UsageError, timeouts)
            log.warning(
                "W&B could not start online (%s: %s); logging offline to %s instead (upload "
                "later with `wandb sync`)",
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
                out / "wandb",
            )
            # wandb keeps the settings of its first start in this process: say offline to
            # wandb.init itself (Lightning's offline=True only sets WANDB_MODE)
            kwargs["settings"] = wandb.Settings(mode="offline")
    return instantiate_checked(logger_cfg, offline=True, **kwargs)


# the lightning.Trainer arguments that decide how many processes train
WORLD_SIZE_KEYS = ("_target_", "accelerator", "devices", "num_nodes", "strategy", "plugins")


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Mute the lines a Trainer prints when it is built ("GPU available ...", tips, warnings):
    the run's own Trainer prints them again."""
    loggers = [
        logging.getLogger(f"lightning.{p}.utilities.rank_zero") for p in ("pytorch", "fabric")
    ]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _is_fsdp(strategy: Any) -> bool:
    if isinstance(strategy, str):
        return strategy.startswith("fsdp")
    return isinstance(strategy, dict) and str(strategy.get("_target_", "")).endswith("FSDPStrategy")


def world_size_for(trainer_cfg: dict[str, Any]) -> int:
    """How many processes train: devices per node × nodes, exactly as Lightning resolves
    trainer.devices (an int, -1, "auto", "2", "0,1", a list of GPU ids) for the accelerator,
    trainer.num_nodes, and a cluster's own counts (SLURM's tasks). Rather than re-implement
    those rules, a bare Trainer is built from the keys that decide them and asked.

    It is also where a process setup that cannot run fails, before any data is read."""
    if _is_fsdp(trainer_cfg.get("strategy")) and (
        trainer_cfg.get("accelerator") == "cpu" or not torch.cuda.is_available()
    ):
        # Lightning runs FSDP on CUDA devices only; say what to use instead
        raise ConfigError("trainer=fsdp needs CUDA GPUs; use trainer=ddp on CPUs")
    probe_cfg = {k: trainer_cfg[k] for k in WORLD_SIZE_KEYS if k in trainer_cfg}
    with _quiet_lightning():
        probe: L.Trainer = instantiate_checked(
            probe_cfg,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    launcher = probe.strategy.launcher
    if (
        sweep_group() is not None
        and probe.world_size > 1
        and isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
    ):
        # this launcher starts the other ranks by re-running the command line, which in a -m
        # sweep re-runs the whole sweep (Lightning supports Hydra's single runs only)
        raise ConfigError(
            f"{probe.world_size} processes per job in a local -m sweep need trainer=ddp "
            "trainer.strategy.start_method=spawn (or sweep on a cluster with "
            "hydra/launcher=submitit_slurm)"
        )
    return int(probe.world_size)


def tokens_per_step(cfg: DictConfig, world_size: int) -> int:
    """Tokens one optimizer step trains on: batch × seq_len × accumulation in every process."""
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    return cfg.data.batch_size * cfg.data.seq_len * accumulate * world_size


def max_steps_for(cfg: DictConfig) -> int:
    """trainer.max_steps, or the optimizer steps that spend train.max_tokens: each step consumes
    batch × seq_len × accumulate_grad_batches tokens in every one of the world-size processes.
    Checks the process setup either way (world_size_for), so call it before any work."""
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    world_size = world_size_for(trainer_cfg)
    if not cfg.train.get("max_tokens"):
        return int(cfg.trainer.max_steps)
    step_tokens = tokens_per_step(cfg, world_size)
    steps = math.ceil(cfg.train.max_tokens / step_tokens)
    log.info(
        "train.max_tokens=%d: %d steps of %d tokens (%d per process)",
        cfg.train.max_tokens,
        steps,
        step_tokens,
        step_tokens // world_size,
    )
    return steps


# what may differ between a checkpoint and the run that resumes it: everything else decides the
# model, the data or their order
RESUMABLE_CHANGES = ("trainer", "eval", "logger", "checkpoint", "resume", "train", "attention")


def resume_checkpoint(cfg: DictConfig, out: Path) -> tuple[Path | None, str | None]:
    """The checkpoint to continue from (resume=auto|PATH), checked against this run's config,
    and the W&B run id it stored; (None, None) for a fresh run. A fresh run never writes over
    another run's checkpoints."""
    setting = cfg.get("resume")
    folder_ckpts = sorted(
        [p for p in [out / "checkpoints" / "last.ckpt"] if p.is_file()]
        + list(out.glob("hpc_ckpt_*.ckpt")),  # Lightning's SLURM requeue checkpoints
        key=lambda p: p.stat().st_mtime,
    )
    if setting in (None, ""):
        if folder_ckpts:
            raise ConfigError(
                f"{out} already holds a run's checkpoints; pass resume=auto to continue it, "
                "or train in a new folder"
            )
        return None, None
    if setting == "auto":
        if not folder_ckpts:
            log.info("resume=auto: no checkpoint in %s yet; starting a new run", out)
            return None, None
        path = folder_ckpts[-1]
    else:
        path = Path(setting).expanduser()
        if path.is_dir():
            path = path / "checkpoints" / "last.ckpt"
    ckpt = read_checkpoint(path)
    stored = ckpt["hyper_parameters"]["config"]
    now = OmegaConf.to_container(cfg, resolve=True)
    for key in sorted(set(stored) | set(now)):
        if key in RESUMABLE_CHANGES or key.endswith("_name"):
            continue
        first = _first_difference(stored.get(key), now.get(key), key)
        if first is not None:
            raise ConfigError(
                f"resume={setting}: {first} differs from the checkpoint's run; resume with the "
                "same settings (only trainer, attention, eval, logger, checkpoint and train "
                "options may change)"
            )
    log.info("resuming from %s", path)
    return path, ckpt.get("wandb_run_id")


def _first_difference(a: Any, b: Any, key: str) -> str | None:
    """The first differing key of a stored config `a` and the current `b` (None: equal). An
    option the stored config predates counts as equal while it is off (None or False)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a and b.get(k) in (None, False):
                continue
            if (diff := _first_difference(a.get(k), b.get(k), f"{key}.{k}")) is not None:
                return diff
        return None
    return None if a == b else f"{key} ({a!r} -> {b!r})"


def resume_command(out: Path) -> str:
    return f"python train.py resume={out}"


def run_training(cfg: DictConfig) -> dict[str, float]:
    """Fit one model; returns the final metrics (also what a Hydra sweeper would optimise)."""
    out = run_dir()
    check_run_config(cfg)  # bad input: one line before any data is read
    max_steps = max_steps_for(cfg)  # a process setup that cannot run fails before work
    resume, wandb_id = resume_checkpoint(cfg, out)
    torch.set_float32_matmul_precision("high")
    config = OmegaConf.to_container(cfg, resolve=True)
    # trainer.precision=auto becomes what this hardware runs fastest; the checkpoint and W&B
    # store the choice
    device_type = device_type_of(str(cfg.trainer.get("accelerator", "auto")))
    precision = resolve_precision(
        cfg.trainer.get("precision", "auto"), device_type, key="trainer.precision"
    )
    log.info(
        "trainer.precision=%s -> %s on %s", cfg.trainer.get("precision"), precision, device_type
    )
    config["trainer"]["precision"] = precision

    datamodule = instantiate_checked(cfg.data, seed=cfg.seed)
    vocab_size = datamodule.vocab_size  # reads (or builds) the token cache: corpus errors here
    L.seed_everything(cfg.seed, workers=True)
    logger = build_logger(config, out, wandb_id=wandb_id)
    module = LanguageModel(config, vocab_size)
    log.info(
        "pos=%s model=%s: %.2fM non-embedding parameters, vocab %d, seq_len %d",
        cfg.pos_name,
        cfg.model_name,
        module.model.num_parameters() / 1e6,
        vocab_size,
        cfg.data.seq_len,
    )
    # a CPU run is bitwise repeatable only with the same number of threads (sums in another
    # order), so the log says how many it had
    log.info("torch threads: %d (OMP_NUM_THREADS sets it)", torch.get_num_threads())

    checkpoint = ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=False,  # last.ckpt is LastCheckpoint's
        auto_insert_metric_name=False,
    )
    every_n_steps = (config.get("checkpoint") or {}).get("every_n_steps")
    last = LastCheckpoint(out / "checkpoints" / "last.ckpt", every_n_steps)
    trainer_cfg = dict(config["trainer"])
    trainer_cfg.pop("compile", None)  # poslab's own option (lit.py), not a Trainer argument
    plugins = trainer_cfg.pop("plugins", None) or []
    plugins = [*(plugins if isinstance(plugins, list) else [plugins])]
    trainer_cfg.update(
        max_steps=max_steps,
        # Lightning counts micro-batches; poslab's interval is in optimizer steps, so that
        # validations (and the checkpoints saved after them) fall between steps
        val_check_interval=min(int(trainer_cfg.get("val_check_interval", max_steps)), max_steps)
        * int(trainer_cfg.get("accumulate_grad_batches") or 1),
        check_val_every_n_epoch=None,
        default_root_dir=str(out),
        use_distributed_sampler=False,  # poslab.sampling gives each rank its part of each batch
    )
    callbacks: list[L.Callback] = [checkpoint, last]
    if cfg.train.get("fingerprints"):  # per-rank data and weight digests (poslab.callbacks)
        callbacks.append(RankFingerprints(out / "fingerprints"))
    trainer: L.Trainer = instantiate_checked(
        trainer_cfg, logger=logger, callbacks=callbacks,
        plugins=[*(instantiate_checked(p) if isinstance(p, dict) else p for p in plugins),
                 AtomicCheckpointIO()],
    )  # fmt: skip

    metrics: dict[str, float] = {}
    failed = True
    try:
        if trainer.is_global_zero:
            write_status(out, "running", resumed_from=str(resume) if resume else None)
        if cfg.train.validate_before_fit and resume is None:
            # the step-0 baseline, so "validation loss falls" is visible in every log
            (initial,) = trainer.validate(module, datamodule=datamodule, verbose=False)
            metrics["val/loss_initial"] = initial["val/loss"]
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
        except TrainingDiverged as err:
            saved = last_good_checkpoint(out)
            raise TrainingDiverged(
                f"{err}: the run diverged and stopped; "
                + (f"the last finite checkpoint is {saved}; " if saved else "")
                + f"lower optim.lr (now {cfg.optim.lr:g}) or check the pos options"
            ) from None
        if last.signal is not None:
            name = signal.Signals(last.signal).name
            line = (
                f"stopped by {name} at step {last.stopped_at}; saved {last.path}; "
                f"resume with: {resume_command(out)}"
            )
            if trainer.is_global_zero:
                write_status(out, "interrupted", step=last.stopped_at, resume=resume_command(out))
            print(line, file=sys.stderr, flush=True)
            log_to_file(line)
            failed = False
            raise SystemExit(128 + last.signal)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1})
        metrics["best_val_loss"] = float(checkpoint.best_model_score or float("nan"))
        log.info("best checkpoint: %s", checkpoint.best_model_path)
        if "val/loss_initial" in metrics:
            log.info(
                "val/loss %.4f at step 0 -> %.4f best",
                metrics["val/loss_initial"],
                metrics["best_val_loss"],
            )

        if trainer.is_global_zero:  # what the scheme learned, as files (and W&B images)
            files = module.model.pos.after_training(
                out / "pos", run=cfg.get("run_name", ""), seed=cfg.seed
            )
            if files and isinstance(logger, WandbLogger):
                import wandb

                logger.experiment.log({f"pos/{p.stem}": wandb.Image(str(p)) for p in files})
        if cfg.eval.after_train and trainer.is_global_zero:
            from poslab.evaluation.run import evaluate_checkpoint

            # full fp32 matmuls (no TF32 on GPUs), so numbers match a later `eval.py`
            torch.set_float32_matmul_precision("highest")
            evaluate_checkpoint(
                checkpoint.best_model_path or str(last.path),
                cfg.eval,
                cache=getattr(datamodule, "cache", None),  # a generated task has none
                out_dir=out,
                wandb_run=logger.experiment if isinstance(logger, WandbLogger) else None,
                trained_tokens=trainer.global_step * tokens_per_step(cfg, trainer.world_size),
            )
        if trainer.is_global_zero:
            write_status(out, "completed", step=trainer.global_step, **_status_metrics(metrics))
        failed = False
    finally:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            # finish even after a crash: the next job of a sweep must start its own W&B run
            logger.experiment.finish(exit_code=1 if failed else 0)
    return metrics


def _status_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k.replace("/", "_"): v for k, v in metrics.items() if math.isfinite(v)}


def last_good_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint of the run (checkpoints are only written while finite)."""
    found = sorted((out / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
