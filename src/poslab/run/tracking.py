"""Where a run's metrics go: the Lightning logger (W&B, CSV, ...), W&B's own files, and the W&B run
of an evaluation. Training and evaluation both log through here; it knows neither."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked

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


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".poslab-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def keep_wandb_files_writable(out: Path) -> None:
    """W&B keeps staging, cache and settings files under HOME (WANDB_DATA_DIR, WANDB_CACHE_DIR,
    WANDB_CONFIG_DIR); where HOME is read-only it failed only after the whole run, when it
    staged the results table. Such a folder is replaced by one in the run folder, with a
    warning, before W&B starts."""
    import wandb.env

    defaults = {
        "WANDB_DATA_DIR": wandb.env.get_data_dir(),
        "WANDB_CACHE_DIR": wandb.env.get_cache_dir(),
        "WANDB_CONFIG_DIR": os.environ.get("WANDB_CONFIG_DIR", "~/.config/wandb"),
    }
    for var, default in defaults.items():
        folder = Path(default).expanduser()
        if not _writable(folder):
            instead = out / "wandb" / var.removeprefix("WANDB_").lower()
            os.environ[var] = str(instead)
            log.warning(
                "W&B cannot write %s; using %s instead (set %s to choose)", folder, instead, var
            )


def build_logger(config: dict[str, Any], out: Path, wandb_id: str | None = None) -> Any:
    """The configured Lightning logger (False for logger=none). For W&B the group is resolved
    here and written back into `config`, so checkpoints (and eval.py) know it; a resumed run
    continues its W&B run (`wandb_id`). W&B is started here, with a bounded wait: if it cannot
    start online (no network, bad credentials), the run goes on with an offline W&B run."""
    logger_cfg = dict(config.get("logger") or {})
    if not logger_cfg:
        return False
    kwargs: dict[str, Any] = {"save_dir": str(out)}
    if not uses_wandb(logger_cfg):
        return instantiate_checked(logger_cfg, **kwargs)
    offline = wandb_offline(logger_cfg.pop("offline", None))
    timeout = float(logger_cfg.pop("init_timeout", 60))
    keep_wandb_files_writable(out)
    # the study driver names its jobs' group in W&B's own variable (a user's value wins)
    logger_cfg["group"] = wandb_group(logger_cfg, sweep_group() or config.get("run_name"))
    config["logger"]["group"] = logger_cfg["group"]
    # each job of a sweep is its own W&B run; the resolved config arrives through the
    # LightningModule's hyperparameters
    kwargs.update(reinit="finish_previous")
    if wandb_id:
        kwargs.update(id=wandb_id, resume="allow")
    if not offline:
        import wandb

        kwargs["settings"] = wandb.Settings(init_timeout=timeout)
        logger = _without_anonymous(instantiate_checked(logger_cfg, offline=False, **kwargs))
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
    return _without_anonymous(instantiate_checked(logger_cfg, offline=True, **kwargs))


def _without_anonymous(logger: Any) -> Any:
    """Lightning's WandbLogger passes `anonymous=None` to wandb.init, and wandb >= 0.19 warns
    that the setting has no effect whenever it is passed at all: leave it out."""
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def wandb_run_of(logger: Any) -> Any:
    """The W&B run a Lightning logger writes to, or None for any other logger."""
    from lightning.pytorch.loggers import WandbLogger

    return logger.experiment if isinstance(logger, WandbLogger) else None


def finish_wandb(logger: Any, failed: bool) -> None:
    """End the logger's W&B run, if it started one, even after a crash: the next job of a sweep
    must start its own W&B run; a signal meanwhile would cut it short and relabel how the run
    ended."""
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger) and logger._experiment is not None:
        with _signals_ignored():
            logger.experiment.finish(exit_code=1 if failed else 0)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _annotation_problem(annotation: Any, value: Any) -> str | None:
    """What is wrong with `value` for a parameter annotated `annotation` (plain types only)."""
    name = getattr(annotation, "__name__", annotation)
    if name == "bool" and not isinstance(value, bool):
        return "must be true or false"
    if name == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        return "must be an integer"
    if name == "float" and (not isinstance(value, int | float) or isinstance(value, bool)):
        return "must be a number"
    return None


def check_logger_options(logger_cfg: dict[str, Any] | None) -> None:
    """Every logger.* option the logger class (or, for W&B, wandb.init) takes, with a value of
    the type it takes: `+logger.flush_logs_every_n_steps=abc` fails now, not mid-training."""
    if not logger_cfg:
        return
    from hydra.utils import get_class

    cls = get_class(logger_cfg["_target_"])
    params = inspect.signature(cls).parameters
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key, value in logger_cfg.items():
        if key in ("_target_", "init_timeout"):  # init_timeout is poslab's (build_logger)
            continue
        param = params.get(key)
        if param is None and passes_on and cls.__name__ == "WandbLogger":
            import wandb  # WandbLogger hands its other options to wandb.init

            param = inspect.signature(wandb.init).parameters.get(key)
        if param is None:
            if passes_on and cls.__name__ != "WandbLogger":
                continue
            raise ConfigError(
                f"logger.{key}: {cls.__name__} has no such option; check the spelling (it has: "
                f"{', '.join(k for k in params if k not in ('kwargs', 'args'))})"
            )
        if value is not None and (problem := _annotation_problem(param.annotation, value)):
            raise ConfigError(f"logger.{key}={value} {problem}")


def start_eval_wandb_run(config: dict[str, Any], eval_config: dict[str, Any], out: Path) -> Any:
    """A W&B run of job_type=eval in the training run's group, for the run whose resolved
    `config` a checkpoint stored (None if that run used no W&B). W&B's files go to `out`."""
    logger = config.get("logger") or {}
    if not uses_wandb(logger):
        return None
    import wandb

    keep_wandb_files_writable(out)  # a read-only HOME: W&B's files go to the run folder
    return wandb.init(
        project=logger.get("project", "poslab"),
        group=logger.get("group"),
        name=f"{config.get('run_name', 'run')}-eval",
        job_type="eval",
        dir=str(out),
        mode="offline" if wandb_offline(logger.get("offline")) else "online",
        config={"eval": eval_config, "train": config},
        reinit="finish_previous",
    )


def log_results(
    run: Any, rows: list[dict], value: str, extra: list[str], paths: dict[str, Path]
) -> None:
    """Result rows in a W&B run: a table (`value` and the `extra` columns), a line plot of
    `value` against length per mode, the PNGs among `paths`, and `value` per length in the
    run's summary."""
    import wandb

    columns = ["scheme", "mode", "length", "factor", value, *extra]
    table = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
    payload: dict[str, Any] = {"extrapolation/table": table}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sub = wandb.Table(
            columns=["length", value],
            data=[[r["length"], r[value]] for r in rows if r["mode"] == mode],
        )
        payload[f"extrapolation/{value}_vs_length_{mode}"] = wandb.plot.line(
            sub, "length", value, title=f"{value} vs eval length ({mode})"
        )
    for name, path in paths.items():
        if path.suffix == ".png" and path.is_file():
            payload[f"extrapolation/{name}"] = wandb.Image(str(path))
    run.log(payload)
    for r in rows:
        run.summary[f"extrapolation/{r['mode']}/{value}@{r['length']}"] = r[value]


def uses_wandb(logger_cfg: Any) -> bool:
    """Whether a run's `logger` config is W&B's."""
    return bool(logger_cfg) and str(logger_cfg.get("_target_", "")).endswith("WandbLogger")


def wandb_group(logger_cfg: Any, fallback: str | None) -> str | None:
    """The W&B group of a run, and of the comparison of a sweep or study: `logger.group`, else
    W&B's own WANDB_RUN_GROUP (the study driver sets it for its jobs), else `fallback` (the
    sweep folder's name, the study's, or the run's name)."""
    return (logger_cfg or {}).get("group") or os.environ.get("WANDB_RUN_GROUP") or fallback


def log_comparison(folder: Path, logger_cfg: Any, group: str, name: str) -> Path | None:
    """A merged comparison (`folder`: compare.py's comparison.csv, .md and figures) as one W&B
    run of job_type=comparison in `group`, the group of the runs it merges, so the W&B project
    shows a sweep or a study as a unit. Its files go to `folder`'s parent, beside those runs'
    (compare.py replaces `folder`). Nothing where the runs used no W&B, or where this very
    comparison was logged before (a study run again with nothing new); a W&B that cannot start,
    or a file it cannot read, is a warning (the comparison is on disk). Returns the W&B run's
    folder."""
    if not uses_wandb(logger_cfg) or not (folder / "comparison.csv").is_file():
        return None
    import hashlib

    import wandb

    home = folder.parent
    digest = hashlib.sha256(
        b"".join(p.read_bytes() for p in sorted(folder.glob("comparison.*")))
    ).hexdigest()
    marker = home / "wandb" / "comparison-logged.sha256"
    if marker.is_file() and marker.read_text().strip() == digest:
        return None
    keep_wandb_files_writable(home)
    offline = wandb_offline(logger_cfg.get("offline"))
    try:
        run = wandb.init(
            project=logger_cfg.get("project") or "poslab",
            entity=logger_cfg.get("entity"),
            group=group,
            name=f"{name}-comparison",
            job_type="comparison",
            dir=str(home),
            mode="offline" if offline else "online",
            settings=wandb.Settings(init_timeout=float(logger_cfg.get("init_timeout") or 60)),
            reinit="finish_previous",
        )
    except Exception as err:  # wandb raises many types (CommError, UsageError, timeouts)
        log.warning("the comparison was not logged to W&B (%s: %s)", type(err).__name__, err)
        return None
    failed = True
    try:
        _log_comparison_files(run, folder)
        where = Path(run.dir).parent
        failed = False
    except Exception as err:  # a damaged file: the study's or sweep's end goes on without it
        log.warning("the comparison was not logged to W&B (%s: %s)", type(err).__name__, err)
        return None
    finally:
        with _signals_ignored():
            run.finish(exit_code=1 if failed else 0)
    marker.write_text(digest + "\n")  # only once it is logged whole
    return where


def _log_comparison_files(run: Any, folder: Path) -> None:
    """The table, the report (the differences, their intervals and Holm p) and the figures."""
    import csv
    import html

    import wandb

    with open(folder / "comparison.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    columns = [
        c for c in (rows[0] if rows else {}) if any(r.get(c) not in ("", None) for r in rows)
    ]
    table = wandb.Table(
        columns=columns,
        data=[[_cell(r.get(c)) for c in columns] for r in rows],
        allow_mixed_types=True,
    )
    payload: dict[str, Any] = {"comparison/table": table}
    if (folder / "comparison.md").is_file():
        text = (folder / "comparison.md").read_text()
        payload["comparison/report"] = wandb.Html(f"<pre>{html.escape(text)}</pre>")
    for png in sorted(folder.glob("*.png")):
        payload[f"comparison/{png.stem}"] = wandb.Image(str(png))
    run.log(payload)
    run.summary["comparison/rows"] = len({r.get("scheme") for r in rows})
    run.summary["comparison/folder"] = str(folder)


def _cell(text: str | None) -> Any:
    """A CSV cell as W&B's table shows it: a number where it is one, empty as nothing."""
    if text in ("", None):
        return None
    try:
        return float(text)
    except ValueError:
        return text
