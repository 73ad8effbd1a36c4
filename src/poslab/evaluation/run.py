"""Evaluate a checkpoint at lengths beyond its training length: `python eval.py ckpt=PATH`."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from poslab.build import load_checkpoint, read_checkpoint
from poslab.checks import require
from poslab.data import EOS, TokenCache
from poslab.errors import NO_SPACE_ERRNOS, ConfigError
from poslab.evaluation.perplexity import score
from poslab.evaluation.report import markdown, metric_name, no_room_error, write_reports
from poslab.positions.rope_scaling import eval_overrides, eval_variant_label
from poslab.precision import AUTOCAST_DTYPE, resolve_precision
from poslab.validate import check_eval_config, eval_lengths, max_tokens_setting

log = logging.getLogger(__name__)


def checkpoint_of_run(run: str | Path) -> Path:
    """The best checkpoint of a training run folder (last.ckpt if there is no best)."""
    folder = Path(run) / "checkpoints"
    for name in ("best.ckpt", "last.ckpt"):
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"run={run} has no checkpoints/best.ckpt or last.ckpt; pass ckpt=PATH")


AUTO_MIN_TOKENS = 65536


def scored_token_cap(setting: Any, trained_tokens: int | None) -> int | None:
    """eval.max_tokens as a number of tokens (None: the whole split). `auto` caps a short run's
    after-training evaluation at the tokens it trained on (at least AUTO_MIN_TOKENS): scoring
    2M tokens ten times for a model that saw 100k tells nothing more than 100k would."""
    if setting is None:
        return None
    if setting == "auto":
        return None if trained_tokens is None else max(AUTO_MIN_TOKENS, int(trained_tokens))
    require("eval.max_tokens", setting, max_tokens_setting)
    return setting


def scheme_label(config: dict) -> str:
    """A trained model's name in tables: the scheme, a training-time variant of it (`rope
    randomized N=2048`), and an attention that is not softmax (`rope, linear attention`)."""
    scheme = config.get("pos_name") or config["pos"]["_target_"].rsplit(".", 1)[-1]
    randomized = config["pos"].get("randomize_max")
    label = f"{scheme} randomized N={randomized}" if randomized else scheme
    attention = config.get("attention") or {}
    if attention.get("_target_"):
        from hydra.utils import get_class

        kernel_label = get_class(attention["_target_"]).row_label(attention)
        label += f", {kernel_label}" if kernel_label else ""
    return label


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("eval.device=cuda but no CUDA device is visible; use eval.device=cpu")
    return torch.device(name)


def models_by_length(
    ckpt: str | Path, eval_cfg: Any, trained: dict, lengths: list[int]
) -> tuple[dict[int, Any], dict]:
    """The model each evaluation length uses, and the run config: eval.pos_overrides plus an
    eval-time variant (RoPE scaling) whose factor may follow the length, so each length gets the
    scheme options it needs; every distinct model is built and checked before any work."""
    train_length = int(trained["data"]["seq_len"])
    overrides_at = {n: eval_overrides(eval_cfg, trained["pos"], n, train_length) for n in lengths}
    built: dict[str, Any] = {}  # overrides -> (model, config)
    for length in lengths:
        key = repr(overrides_at[length])
        if key not in built:
            built[key] = load_checkpoint(ckpt, overrides_at[length])
    model_at = {n: built[repr(overrides_at[n])][0] for n in lengths}
    return model_at, next(iter(built.values()))[1]


def row_name(config: dict, eval_cfg: Any) -> tuple[str, str]:
    """(the rows' scheme name, the eval-time variant): an eval-time change of the scheme is part
    of the name, `rope + yarn s=auto`."""
    parts = [f"{k}={v}" for k, v in (eval_cfg.get("pos_overrides") or {}).items()]
    variant = ", ".join(p for p in [*parts, eval_variant_label(eval_cfg)] if p)
    scheme = scheme_label(config)
    return (f"{scheme} + {variant}" if variant else scheme), variant


def unsupported_lengths(
    model_at: dict[int, Any], eval_cfg: Any, max_position: Callable[[int], int]
) -> dict[int, str]:
    """length -> why the scheme cannot represent the positions up to `max_position(length)`
    (learned positions past their table); with eval.unsupported=error the first such length is
    the error. Checked before any scoring."""
    unsupported: dict[int, str] = {}
    for length, model in model_at.items():
        try:
            model.pos.check_length(max_position(length))
        except ConfigError as err:
            if eval_cfg.unsupported == "error":
                raise
            unsupported[length] = str(err)
    return unsupported


def evaluate_checkpoint(
    ckpt: str | Path,
    eval_cfg: Any,
    cache: TokenCache | None = None,
    out_dir: str | Path | None = None,
    wandb_run: Any = None,
    data_path: str | None = None,
    trained_tokens: int | None = None,
) -> list[dict]:
    """Score the checkpoint at every eval length and mode; write reports; return the rows.
    `trained_tokens` (after training) lets `eval.max_tokens=auto` cap a short run's evaluation.
    A checkpoint trained on a generated task (data=passkey, ...) is scored on that task."""
    if isinstance(eval_cfg, DictConfig):
        eval_cfg = OmegaConf.create(OmegaConf.to_container(eval_cfg, resolve=True))
    check_eval_config(eval_cfg)
    trained = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    if "task" in trained["data"]:
        from poslab.evaluation.tasks import evaluate_task_checkpoint

        return evaluate_task_checkpoint(ckpt, eval_cfg, trained, out_dir, wandb_run)
    train_length = int(trained["data"]["seq_len"])
    lengths = eval_lengths(eval_cfg, train_length)
    model_at, config = models_by_length(ckpt, eval_cfg, trained, lengths)
    model = model_at[lengths[0]]
    device = pick_device(eval_cfg.device)
    precision = resolve_precision(eval_cfg.precision, device.type, key="eval.precision")
    log.info("evaluating on %s with precision %s", device, precision)
    overrides = {"path": data_path} if data_path else {}
    cache = cache or TokenCache.from_config(config["data"], **overrides)
    cache_vocab = cache.meta()["vocab_size"]
    if cache_vocab != model.config.vocab_size:
        raise ConfigError(
            f"the token cache {cache.folder} has a vocabulary of {cache_vocab} but "
            f"the checkpoint was trained with {model.config.vocab_size}; pass the corpus it was "
            "trained on (data_path=) with the same tokenizer settings"
        )
    split = cache.split(eval_cfg.split)
    cap = scored_token_cap(eval_cfg.max_tokens, trained_tokens)
    if cap is not None and cap < len(split):
        whole = len(split)
        split = split.head(cap)
        if eval_cfg.max_tokens == "auto":
            print(
                f"eval.max_tokens=auto: scoring the first {len(split):,} of {whole:,} "
                f"{eval_cfg.split} tokens (this run trained on {trained_tokens:,} tokens); "
                "eval.max_tokens=null scores the whole split",
                flush=True,
            )
    split = split.after_line_end(cache.tokenizer().token_to_id(EOS))
    offset = int(eval_cfg.position_offset)
    bucket = int(eval_cfg.bucket_size or max(1, train_length // 32))
    scheme, variant = row_name(config, eval_cfg)
    word_level = bool(config["data"].get("word_level"))

    unsupported = unsupported_lengths(model_at, eval_cfg, lambda n: offset + n - 1)
    if len(split.ids) < 2:
        raise ConfigError(f"the {eval_cfg.split} split has fewer than 2 tokens")

    rows: list[dict] = []
    for mode in eval_cfg.modes:
        for length in lengths:
            row = {
                "scheme": scheme, "train_length": train_length, "mode": mode,
                "split": eval_cfg.split, "length": length, "factor": length / train_length,
                "word_level": word_level, "position_offset": offset, "status": "ok",
                "vocab_size": model.config.vocab_size, "variant": variant,
            }  # fmt: skip
            if length in unsupported:
                rows.append({**row, "status": f"skipped: {unsupported[length]}"})
                continue
            # the stride is capped at the window, so one eval.stride serves every length
            stride = min(length, int(eval_cfg.stride or max(1, length // 2)))
            model = model_at[length].to(device)
            result = score(
                model, split, length, mode, stride if mode == "sliding" else None,
                batch_size=eval_cfg.batch_size, position_offset=offset, bucket_size=bucket,
                autocast_dtype=AUTOCAST_DTYPE[precision],
            )  # fmt: skip
            row.update({k: v for k, v in result.to_dict().items() if not k.startswith("bucket")})
            row["loss_by_position"] = result.loss_by_position()
            if not math.isfinite(row["loss"]):
                # a diverged model: reported as such, never as a number or a skipped length
                row["status"] = "nonfinite"
            rows.append(row)
            log.info(
                "%s %s L=%d: ppl %.2f, %s %.3f (%d tokens, %.0f tok/s)", scheme, mode, length,
                row["ppl"], metric_name([row]), row[metric_name([row])], row["tokens"],
                row["tokens_per_s"],
            )  # fmt: skip

    title = f"{scheme}: perplexity vs evaluation length"
    return report_rows(rows, title, ckpt, out_dir, eval_cfg, wandb_run)


def report_rows(
    rows: list[dict], title: str, ckpt: str | Path, out_dir: str | Path | None, eval_cfg: Any,
    wandb_run: Any,
) -> list[dict]:  # fmt: skip
    """Write an evaluation's rows to <out_dir>/extrapolation/ (after training: the run folder),
    print its table, log it to W&B when asked; returns the rows. Without out_dir (eval.py) the
    files go to a folder of the checkpoint's run that holds no results yet (results_folder)."""
    if out_dir:
        out, claimed = Path(out_dir) / "extrapolation", False
    else:
        out, claimed = results_folder(default_out_dir(ckpt), rows)
    try:
        paths = write_reports(rows, out, title, series_key="mode")
    except BaseException:
        if claimed:  # the new folder stays only with a complete set of results in it
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    print(markdown(rows, title, "mode"), flush=True)
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}", flush=True)
    if wandb_run is not None and eval_cfg.log_wandb:
        log_to_wandb(wandb_run, rows, paths)
    return rows


def default_out_dir(ckpt: str | Path) -> Path:
    """The run folder of a checkpoint in <run>/checkpoints/, else the checkpoint's own folder."""
    parent = Path(ckpt).resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def folder_slug(text: str, limit: int = 48) -> str:
    """`text` as part of a folder name: `yarn s=auto` -> `yarn-s-auto`."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-._")[:limit].rstrip("-._")


def claim_folder(folder: Path) -> bool:
    """Create `folder`; False if it exists. No room or no permission: one line (ConfigError)."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno in NO_SPACE_ERRNOS:
            raise no_room_error(folder, err) from None
        if isinstance(err, PermissionError):
            raise ConfigError(
                f"cannot create {folder}: permission denied; pass out_dir=FOLDER (a folder you "
                "can write to)"
            ) from None
        raise
    return True


def results_folder(run: Path, rows: list[dict]) -> tuple[Path, bool]:
    """Where eval.py without out_dir writes, and whether this call created (claimed) it.

    The run's `extrapolation/` while it holds nothing (a run evaluated for the first time, e.g.
    one trained with eval.after_train=false or stopped before its evaluation), so compare.py
    finds it as the run's result. Otherwise a new `extrapolation-<time>[-<variant>]/` beside
    it: a re-evaluation (another eval.rope_scaling.kind, another split, ...) never replaces the
    after-training table. compare.py's find_results reads only `extrapolation/extrapolation.json`
    (a folder named exactly `extrapolation`), so the new folder adds no row to a comparison of
    the run or its sweep and never poses as another seed of it. Says where the files go."""
    first = run / "extrapolation"
    if claim_folder(first):
        return first, True
    if first.is_dir() and not any(first.iterdir()):
        return first, False
    variant = folder_slug(str(rows[0].get("variant") or "")) if rows else ""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = f"extrapolation-{stamp}-{variant}" if variant else f"extrapolation-{stamp}"
    for n in range(1, 1000):
        folder = run / (base if n == 1 else f"{base}-{n}")
        if not claim_folder(folder):  # a second eval.py in the same second takes the next name
            continue
        print(
            f"{first} already holds results (kept as they are); this evaluation goes to {folder} "
            "(out_dir=FOLDER writes to FOLDER/extrapolation/ instead)",
            flush=True,
        )
        return folder, True
    raise ConfigError(f"{run} has no free name for a new results folder ({base}-N); pass out_dir=")


def log_to_wandb(run: Any, rows: list[dict], paths: dict[str, Path]) -> None:
    """A table, a line plot per mode (perplexity, or accuracy for a task), and the PNGs, in the
    given W&B run."""
    import wandb

    ok = [r for r in rows if r["status"] == "ok"]
    value = "accuracy" if any("accuracy" in r for r in ok) else "ppl"
    extra = ["token_accuracy", "ppl", "loss"] if value == "accuracy" else ["loss", metric_name(ok)]
    columns = ["scheme", "mode", "length", "factor", value, *extra]
    table = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in ok])
    payload: dict[str, Any] = {"extrapolation/table": table}
    for mode in dict.fromkeys(r["mode"] for r in ok):
        sub = wandb.Table(
            columns=["length", value],
            data=[[r["length"], r[value]] for r in ok if r["mode"] == mode],
        )
        payload[f"extrapolation/{value}_vs_length_{mode}"] = wandb.plot.line(
            sub, "length", value, title=f"{value} vs eval length ({mode})"
        )
    for name, path in paths.items():
        if path.suffix == ".png" and path.is_file():
            payload[f"extrapolation/{name}"] = wandb.Image(str(path))
    run.log(payload)
    for r in ok:
        run.summary[f"extrapolation/{r['mode']}/{value}@{r['length']}"] = r[value]


def run_eval(cfg: DictConfig) -> list[dict]:
    """Entry point of eval.py: pick the checkpoint, evaluate, optionally log to W&B."""
    if bool(cfg.ckpt) == bool(cfg.run):
        raise ConfigError("pass exactly one of ckpt=PATH (a .ckpt file) or run=RUN_DIR")
    check_eval_config(cfg.eval)
    ckpt = Path(cfg.ckpt) if cfg.ckpt else checkpoint_of_run(cfg.run)
    # a missing or foreign file, or an eval-time variant the scheme cannot take: one clear line
    # before anything starts (no W&B run for a command that cannot run)
    trained = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    if "task" in trained["data"]:  # scored per example: the corpus options would be ignored
        from poslab.evaluation.tasks import corpus_options_set, task_options_error

        unused = corpus_options_set(cfg.eval)
        if unused:
            raise ConfigError(task_options_error(ckpt, trained, unused))
    train_length = int(trained["data"]["seq_len"])
    for length in eval_lengths(cfg.eval, train_length):
        eval_overrides(cfg.eval, trained["pos"], length, train_length)
    wandb_run = None
    if cfg.eval.log_wandb and cfg.wandb:
        wandb_run = start_eval_wandb_run(ckpt, cfg)
    try:
        return evaluate_checkpoint(
            ckpt, cfg.eval, out_dir=cfg.out_dir, wandb_run=wandb_run, data_path=cfg.data_path
        )
    finally:
        if wandb_run is not None:
            wandb_run.finish()


def start_eval_wandb_run(ckpt: Path, cfg: DictConfig) -> Any:
    """A W&B run of job_type=eval in the training run's group (None if it used no W&B)."""
    import wandb

    from poslab.training import keep_wandb_files_writable, wandb_offline

    config = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    logger = config.get("logger") or {}
    if not str(logger.get("_target_", "")).endswith("WandbLogger"):
        return None
    out = default_out_dir(ckpt) if not cfg.out_dir else Path(cfg.out_dir)
    keep_wandb_files_writable(out)  # a read-only HOME: W&B's files go to the run folder
    return wandb.init(
        project=logger.get("project", "poslab"),
        group=logger.get("group"),
        name=f"{config.get('run_name', 'run')}-eval",
        job_type="eval",
        dir=str(out),
        mode="offline" if wandb_offline(logger.get("offline")) else "online",
        config={"eval": OmegaConf.to_container(cfg.eval, resolve=True), "train": config},
        reinit="finish_previous",
    )
