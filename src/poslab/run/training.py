"""`python train.py ...`: build data, model, logger and Trainer from the Hydra config and fit."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import statistics
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from omegaconf import DictConfig, OmegaConf

from poslab.errors import ConfigError, DiskFull, RunInterrupted, TrainingDiverged
from poslab.instantiate import instantiate_checked
from poslab.model.build import read_checkpoint
from poslab.model.precision import device_type_of, machine_name, resolve_precision
from poslab.run.callbacks import AtomicCheckpointIO, LastCheckpoint, LearningSpeed, RankFingerprints
from poslab.run.console import progress_bar_setting
from poslab.run.extend import (
    Parent,
    check_parent_vocabulary,
    inherit_parent,
    lineage_of,
    load_parent_weights,
    record_effective_config,
)
from poslab.run.lit import LanguageModel
from poslab.run.run_folder import (
    claim_run_folder,
    is_main_process,
    read_status,
    resume_command,
    run_dir,
    write_run_settings,
    write_status,
)
from poslab.run.tracking import (
    build_logger,
    check_logger_options,
    finish_wandb,
    sweep_group,
    wandb_run_of,
)
from poslab.run.validate import check_run_config

log = logging.getLogger(__name__)


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
    # every option the run's Trainer gets (a value Lightning refuses fails here, before the run
    # takes its folder), without what only the run decides (precision=auto, plugins, callbacks)
    skipped = (*OWN_TRAINER_KEYS, "plugins")
    probe_cfg = {
        k: v
        for k, v in trainer_cfg.items()
        if k not in skipped and not (k == "precision" and v == "auto")
    }
    probe_cfg["_target_"] = trainer_cfg.get("_target_", "lightning.Trainer")
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    probe_cfg.update(logger=False, enable_checkpointing=False, **quiet)
    with _quiet_lightning():
        probe: L.Trainer = instantiate_checked(probe_cfg)
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


# trainer.* keys that are poslab's, not lightning.Trainer arguments
OWN_TRAINER_KEYS = ("_target_", "compile")


def check_trainer_options(trainer_cfg: dict[str, Any]) -> None:
    """An option lightning.Trainer does not take (`+trainer.bogus=1`) fails now, in one line,
    not after the data is read."""
    takes = inspect.signature(L.Trainer.__init__).parameters
    for key in trainer_cfg:
        if key not in takes and key not in OWN_TRAINER_KEYS:
            raise ConfigError(
                f"trainer.{key}: lightning.Trainer has no such option; check the spelling (its "
                "options: https://lightning.ai/docs/pytorch/stable/common/trainer.html)"
            )


def tokens_per_step(cfg: DictConfig, world_size: int) -> int:
    """Tokens one optimizer step trains on: batch × seq_len × accumulation in every process."""
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    return cfg.data.batch_size * cfg.data.seq_len * accumulate * world_size


def max_steps_for(cfg: DictConfig) -> int:
    """trainer.max_steps, or the optimizer steps that spend train.max_tokens: each step consumes
    batch × seq_len × accumulate_grad_batches tokens in every one of the world-size processes.
    Checks the process setup either way (world_size_for), so call it before any work."""
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_options(trainer_cfg)
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
RESUMABLE_CHANGES = (
    "trainer",
    "eval",
    "logger",
    "checkpoint",
    "resume",
    "train",
    "attention",
    "after_training",
    "callbacks",
)


@dataclass
class Resume:
    """What a resumed run continues from: its checkpoint, the W&B run, the config it stored
    (whose resolved trainer.precision the run keeps), the step, and what its status recorded."""

    path: Path
    wandb_id: str | None
    config: dict[str, Any]
    step: int
    status: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The metrics the run's status file holds (kept across a resume with no new steps)."""
        numbers = {k: v for k, v in self.status.items() if k != "step"}
        return {
            k: v
            for k, v in numbers.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }


def resume_checkpoint(cfg: DictConfig, out: Path) -> Resume | None:
    """The checkpoint to continue from (resume=auto|PATH), checked against this run's config;
    None for a fresh run. A fresh run never writes over another run's checkpoints; a run
    folder whose run was stopped before its first checkpoint starts anew in that folder."""
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
        return None
    if setting == "auto":
        if not folder_ckpts:
            log.info("resume=auto: no checkpoint in %s yet; starting a new run", out)
            return None
        path = folder_ckpts[-1]
    else:
        path = Path(setting).expanduser()
        if path.is_dir():
            started = (path / "checkpoints" / "last.ckpt").is_file()
            if not started and path.resolve() == out.resolve():
                log.info(
                    "resume=%s: the run stopped before its first checkpoint; starting it anew "
                    "in its folder",
                    setting,
                )
                return None
            path = path / "checkpoints" / "last.ckpt"
    ckpt = read_checkpoint(path)
    stored = ckpt["hyper_parameters"]["config"]
    now = OmegaConf.to_container(cfg, resolve=True)
    for key in sorted(set(stored) | set(now)):
        if key in RESUMABLE_CHANGES or key == "hydra" or key.endswith("_name"):
            continue
        first = _first_difference(stored.get(key), now.get(key), key)
        if first is not None:
            raise ConfigError(
                f"resume={setting}: {first} differs from the checkpoint's run; resume with the "
                "same settings (only trainer, attention, eval, logger, checkpoint and train "
                "options may change)"
            )
    log.info("resuming from %s", path)
    same_folder = path.resolve().is_relative_to(out.resolve())
    status = read_status(out) if same_folder else {}
    step = int(ckpt.get("global_step", 0))
    return Resume(path, ckpt.get("wandb_run_id"), stored, step, status)


# where things are kept, not what they are: a resumed run may find its token cache elsewhere
# (POSLAB_CACHE set in one shell and not in the other)
LOCATION_KEYS = ("data.cache_dir",)


def _first_difference(a: Any, b: Any, key: str) -> str | None:
    """The first differing key of a stored config `a` and the current `b` (None: equal). An
    option the stored config predates counts as equal while it is off (None or False)."""
    if key in LOCATION_KEYS:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a and b.get(k) in (None, False):
                continue
            if (diff := _first_difference(a.get(k), b.get(k), f"{key}.{k}")) is not None:
                return diff
        return None
    return None if a == b else f"{key} ({a!r} -> {b!r})"


@dataclass
class FinishedRun:
    """What a finished training hands to its after-training steps (conf `after_training:`)."""

    config: DictConfig
    out: Path
    checkpoint: str  # the best checkpoint (last.ckpt where there is none)
    cache: Any  # the corpus's token cache (None for a generated task)
    wandb_run: Any  # the run's W&B run (None without W&B)
    trained_tokens: int


@dataclass
class _Run:
    """The parts of one training run, once set up."""

    config: dict[str, Any]
    datamodule: Any
    logger: Any
    module: LanguageModel
    trainer: L.Trainer
    best: ModelCheckpoint
    last: LastCheckpoint


def run_training(
    cfg: DictConfig, after_training: list[Any] | None = None, parent: Parent | None = None
) -> dict[str, float]:
    """Fit one model; returns the final metrics (also what a Hydra sweeper would optimise).
    `after_training`: the steps check_run_config built, where the caller checked the config
    (and, for extend=RUN, gave it the parent's architecture: `parent`)."""
    out = run_dir()
    if after_training is None:
        parent = inherit_parent(cfg)  # extend=RUN: the parent's architecture, checked
        after_training = check_run_config(cfg)  # bad input: one line before any data is read
    max_steps = max_steps_for(cfg)  # a process setup that cannot run fails before work
    _check_callbacks_and_logger(cfg)
    resume = resume_checkpoint(cfg, out)
    if resume and resume.status.get("status") == "completed" and resume.step >= max_steps:
        # a finished run (a sweep resumed with resume=auto): nothing to do, nothing written
        log.info(
            "%s completed at step %d (trainer.max_steps=%d); nothing to do (raise "
            "trainer.max_steps to train on)",
            out,
            resume.step,
            max_steps,
        )
        return resume.metrics()
    run = _set_up(cfg, out, resume, max_steps, parent)
    # a resumed run that trains no further (its evaluation was interrupted) keeps the metrics
    # its status recorded
    metrics: dict[str, float] = resume.metrics() if resume else {}
    failed = True
    phase = "setup"
    try:
        if run.trainer.is_global_zero:
            resumed_from = str(resume.path) if resume else None
            write_status(out, "running", resumed_from=resumed_from, **_status_metrics(metrics))
            _record_run(cfg, out, run, parent, resume)
        if cfg.train.validate_before_fit and resume is None:
            # the step-0 baseline, so "validation loss falls" is visible in every log
            trainer, module, datamodule = run.trainer, run.module, run.datamodule
            log.info("validation at step 0, the loss training starts from (seconds to minutes)")
            (initial,) = trainer.validate(module, datamodule=datamodule, verbose=False)
            metrics["val/loss_initial"] = initial["val/loss"]
        phase = "training"
        _fit(cfg, out, run, resume, metrics)
        phase = "evaluation"
        if run.trainer.is_global_zero:  # training is done: an interruption from here keeps it
            _after_training(cfg, out, run, metrics, after_training)
        failed = False
    except RunInterrupted as stop:
        failed = False  # what finished is saved, and the status line says how to go on
        if not stop.phase:  # the job's own handler: say where it landed
            stop.phase = phase
            saved = run.best.best_model_path or last_good_checkpoint(out) or ""
            stop.saved = str(saved) or None
            if phase == "training":
                stop.step = int(run.trainer.global_step)
        raise
    finally:
        finish_wandb(run.logger, failed)
    return metrics


def _check_callbacks_and_logger(cfg: DictConfig) -> None:
    """A bad callback or logger option fails before work, too."""
    callbacks = cfg.get("callbacks")
    configured_callbacks(
        {"callbacks": OmegaConf.to_container(callbacks, resolve=True)} if callbacks else {}
    )
    check_logger_options(OmegaConf.to_container(cfg.logger, resolve=True) if cfg.logger else None)


def _set_up(
    cfg: DictConfig, out: Path, resume: Resume | None, max_steps: int, parent: Parent | None
) -> _Run:
    """Data, logger, model (a child of extend=: its parent's weights) and Trainer of the run;
    takes the run folder once the data is read."""
    torch.set_float32_matmul_precision("high")
    config = OmegaConf.to_container(cfg, resolve=True)
    config["trainer"]["precision"] = _run_precision(cfg, resume)
    datamodule = instantiate_checked(cfg.data, seed=cfg.seed)
    vocab_size = datamodule.vocab_size  # reads (or builds) the token cache: corpus errors here
    cache = getattr(datamodule, "cache", None)  # a generated task has no tokenizer
    _check_eval_split(cfg, cache)
    if parent is not None:  # the child's tokens must be the parent's
        check_parent_vocabulary(parent, vocab_size, cache.tokenizer_record() if cache else None)
    if is_main_process():
        claim_run_folder(out)  # every check passed: from here on, the run writes its folder
        if parent is not None:
            record_effective_config(out, cfg)
    L.seed_everything(cfg.seed, workers=True)
    logger = build_logger(config, out, wandb_id=resume.wandb_id if resume else None)
    module = LanguageModel(config, vocab_size)
    if parent is not None and resume is None:  # (a resumed child has its own weights)
        load_parent_weights(module.model, parent)
    if cache is not None:
        module.tokenizer_record = cache.tokenizer_record()
        if is_main_process():
            (out / "tokenizer.json").write_text(module.tokenizer_record["json"])
    log.info(
        "pos=%s model=%s: %.2fM non-embedding parameters, vocab %d, seq_len %d",
        cfg.pos_name,
        cfg.model_name,
        module.model.num_parameters() / 1e6,
        vocab_size,
        cfg.data.seq_len,
    )
    # a CPU run is bitwise repeatable only with the same number of threads (sums in another
    # order), so the log says how many it had; on a busy machine, fewer (run/threads.py)
    from poslab.run.threads import choose_threads

    choose_threads(device_type_of(str(cfg.trainer.get("accelerator", "auto"))))
    trainer, best, last = _build_trainer(cfg, config, out, max_steps, logger)
    return _Run(config, datamodule, logger, module, trainer, best, last)


def _check_eval_split(cfg: DictConfig, cache: Any) -> None:
    """The split the evaluation after training scores exists, known once the corpus is read:
    before training, not after it (#43)."""
    if cache is None or not cfg.eval.after_train or cfg.eval.get("documents"):
        return
    splits = sorted(cache.meta()["splits"])
    if cfg.eval.split not in splits:
        raise ConfigError(
            f"eval.split={cfg.eval.split}: the corpus has no {cfg.eval.split} split (it has "
            f"{', '.join(splits)}); choose one of those, or add its file to data.path"
        )


def _run_precision(cfg: DictConfig, resume: Resume | None) -> str:
    """trainer.precision=auto becomes what this hardware runs fastest, once per run: the
    checkpoint and W&B store the choice, and a resumed run keeps it."""
    device_type = device_type_of(str(cfg.trainer.get("accelerator", "auto")))
    precision = resolve_precision(
        cfg.trainer.get("precision", "auto"),
        device_type,
        key="trainer.precision",
        stored=resume.config["trainer"].get("precision") if resume else None,
    )
    log.info(
        "trainer.precision=%s -> %s on %s", cfg.trainer.get("precision"), precision, device_type
    )
    return precision


def configured_callbacks(config: dict[str, Any]) -> list[L.Callback]:
    """The callbacks of conf/callbacks/ (`callbacks:`), built in their order; null drops one.
    A config written before the group existed gets the console line it always had."""
    entries = config.get("callbacks")
    if entries is None:
        every = (config.get("trainer") or {}).get("log_every_n_steps", 50)
        entries = {"console": {"_target_": "poslab.run.console.ConsoleLine", "every": every}}
    built = []
    for name, entry in entries.items():
        if entry is None:
            continue
        if not isinstance(entry, dict) or "_target_" not in entry:
            raise ConfigError(
                f"callbacks.{name} must be a mapping with a _target_ (a Lightning Callback "
                "class) and its options, or null to drop it"
            )
        callback = instantiate_checked(entry)
        if not isinstance(callback, L.Callback):
            raise ConfigError(
                f"callbacks.{name}: {entry['_target_']} is not a lightning Callback; name a "
                "Callback class"
            )
        built.append(callback)
    return built


def _build_trainer(
    cfg: DictConfig, config: dict[str, Any], out: Path, max_steps: int, logger: Any
) -> tuple[L.Trainer, ModelCheckpoint, LastCheckpoint]:
    """The run's Trainer, with its best.ckpt and last.ckpt callbacks."""
    best = ModelCheckpoint(
        dirpath=out / "checkpoints",
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=False,  # last.ckpt is LastCheckpoint's
        auto_insert_metric_name=False,
        # one best.ckpt, always: a best.ckpt left by a killed run is written over, never kept
        # beside a best-v1.ckpt that holds the real best
        enable_version_counter=False,
    )
    every_n_steps = (config.get("checkpoint") or {}).get("every_n_steps")
    last = LastCheckpoint(out / "checkpoints" / "last.ckpt", every_n_steps)
    trainer_cfg = dict(config["trainer"])
    trainer_cfg.pop("compile", None)  # poslab's own option (lit.py), not a Trainer argument
    plugins = trainer_cfg.pop("plugins", None) or []
    plugins = plugins if isinstance(plugins, list) else [plugins]
    plugins = [instantiate_checked(p) if isinstance(p, dict) else p for p in plugins]
    accumulate = int(trainer_cfg.get("accumulate_grad_batches") or 1)
    trainer_cfg.update(
        max_steps=max_steps,
        # Lightning counts micro-batches; poslab's interval is in optimizer steps, so that
        # validations (and the checkpoints saved after them) fall between steps
        val_check_interval=min(int(trainer_cfg.get("val_check_interval", max_steps)), max_steps)
        * accumulate,
        check_val_every_n_epoch=None,
        default_root_dir=str(out),
        use_distributed_sampler=False,  # poslab.sampling gives each rank its part of each batch
    )
    # a bar on a terminal only (`auto`); a line every log_every_n_steps everywhere
    trainer_cfg["enable_progress_bar"] = progress_bar_setting(
        trainer_cfg.get("enable_progress_bar")
    )
    callbacks: list[L.Callback] = [best, last, *configured_callbacks(config)]
    if "task" in cfg.data:  # steps to learn (and train.stop_at_accuracy): before the checkpoints
        stop_at = cfg.train.get("stop_at_accuracy")
        target = stop_at if stop_at is not None else cfg.eval.get("learned_at", 0.9)
        callbacks.insert(0, LearningSpeed(float(target), stop=stop_at is not None))
    if cfg.train.get("fingerprints"):  # per-rank data and weight digests (poslab.run.callbacks)
        callbacks.append(RankFingerprints(out / "fingerprints"))
    trainer: L.Trainer = instantiate_checked(
        trainer_cfg, logger=logger, callbacks=callbacks, plugins=[*plugins, AtomicCheckpointIO()]
    )
    return trainer, best, last


def _fit(
    cfg: DictConfig, out: Path, run: _Run, resume: Resume | None, metrics: dict[str, float]
) -> None:
    """The training, and its metrics into `metrics`."""
    try:
        ckpt_path = resume.path if resume else None
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt_path)
    except TrainingDiverged as err:
        saved = last_good_checkpoint(out)
        raise TrainingDiverged(
            f"{err}: the run diverged and stopped; "
            + (f"the last finite checkpoint is {saved}; " if saved else "")
            + f"lower optim.lr (now {cfg.optim.lr:g}) or check the pos options"
        ) from None
    except DiskFull as err:
        saved = last_good_checkpoint(out)
        then = (
            f"{saved} is intact; then resume with: {resume_command(out)}"
            if saved
            else "does not exist yet; then run the command again"
        )
        raise DiskFull(f"{err}; the last good checkpoint {then}") from None
    last = run.last
    if last.signal is not None:  # (after the last batch: the final save was the stop)
        step = last.stopped_at if last.stopped_at is not None else run.trainer.global_step
        raise RunInterrupted(last.signal, "training", step, str(last.path))
    scalars = run.trainer.callback_metrics.items()
    metrics.update({k: float(v) for k, v in scalars if v.numel() == 1})
    metrics["best_val_loss"] = float(run.best.best_model_score or float("nan"))
    if run.module.step_rates:  # the steps of this process (a resumed run: since the resume)
        metrics["train/tokens_per_s_median"] = statistics.median(run.module.step_rates)
    log.info("best checkpoint: %s", run.best.best_model_path)
    if "val/loss_initial" in metrics:
        log.info(
            "val/loss %.4f at step 0 -> %.4f best",
            metrics["val/loss_initial"],
            metrics["best_val_loss"],
        )


def _after_training(
    cfg: DictConfig, out: Path, run: _Run, metrics: dict[str, float], steps: list[Any]
) -> None:
    """Rank 0, once training is done: the scheme's own files (what it learned), then each
    after-training step the config names (the evaluation), then the `completed` status."""
    trainer = run.trainer
    status = _status_metrics(metrics)
    write_status(out, "running", phase="evaluation", step=trainer.global_step, **status)
    files = run.module.model.pos.after_training(
        out / "pos", run=cfg.get("run_name", ""), seed=cfg.seed
    )  # what the scheme learned, as files (and W&B images)
    wandb_run = wandb_run_of(run.logger)
    if files and wandb_run is not None:
        import wandb

        wandb_run.log({f"pos/{p.stem}": wandb.Image(str(p)) for p in files})
    finished = FinishedRun(
        config=cfg,
        out=out,
        checkpoint=run.best.best_model_path or str(run.last.path),
        cache=getattr(run.datamodule, "cache", None),  # a generated task has none
        wandb_run=wandb_run,
        trained_tokens=trainer.global_step * tokens_per_step(cfg, trainer.world_size),
    )
    for step in steps:
        step(finished)
    write_status(out, "completed", step=trainer.global_step, **_status_metrics(metrics))


def _record_run(cfg: DictConfig, out: Path, run: _Run, parent: Any, resume: Any) -> None:
    """run.json: what scripts/runs.py lists the run by; compare.py reads the resolved precision
    and every row's provenance the machine that trained it."""
    machine = machine_name(run.trainer.strategy.root_device, run.trainer.world_size)
    precision = run.config["trainer"]["precision"]
    lineage = lineage_of(out, parent, resume)
    write_run_settings(out, cfg, precision=precision, machine=machine, **lineage)


def _status_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k.replace("/", "_"): v for k, v in metrics.items() if math.isfinite(v)}


def last_good_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint of the run (checkpoints are only written while finite)."""
    found = sorted((out / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
