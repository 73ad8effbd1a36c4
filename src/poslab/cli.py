"""What train.py and eval.py share around Hydra: errors as one line with exit code 2, run folders
that say how the run ended, and `resume=RUN` continuing a run in its own folder.

* Hydra's own errors (an unknown option `pos=foo`, a misspelled key `pos.bsae=500`, bad override
  syntax) become one line and exit code 2, like poslab's ConfigError.
* A run that fails on bad input before any work leaves no folder behind; one that fails later
  keeps its folder, whose `train.log` ends with the error line and whose `status.json` says
  `failed` (or `interrupted`, with the command that resumes it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from poslab.errors import EXIT_BAD_INPUT, ConfigError, report

log = logging.getLogger(__name__)

# what Hydra puts in a run folder before the task starts; a folder holding nothing else has
# seen no work yet
HYDRA_FILES = {".hydra", "train.log", "eval.log"}
STATUS_FILE = "status.json"


def run_dir() -> Path:
    """This job's output folder (Hydra's), or the current folder outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def write_status(folder: Path, status: str, **details: Any) -> None:
    """<run>/status.json: running | completed | interrupted | failed, with details (step, error,
    the command that resumes it). Written through a temporary file, so it is never half-written."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {"status": status, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **details}
    tmp = folder / f".{STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, folder / STATUS_FILE)


def log_to_file(line: str) -> None:
    """Append `line` to the run's log file(s) only (the console already shows it)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.acquire()
            try:
                handler.stream.write(line + "\n")
                handler.flush()
            finally:
                handler.release()


def _untouched(folder: Path) -> bool:
    """True when the folder holds only what Hydra wrote before the task started."""
    try:
        return folder.is_dir() and set(os.listdir(folder)) <= HYDRA_FILES
    except OSError:
        return False


def _close_file_logs(folder: Path) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == folder:
            handler.close()
            root.removeHandler(handler)


def hydra_task(owns_folder: bool) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Wrap a Hydra task function: errors end up as one line on stderr and in the log file; bad
    input found before any work removes the folder Hydra created for it. A task that owns its
    folder (training; not eval.py, which logs into the evaluated run's) also records a failure
    in the folder's status.json."""

    def decorate(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return functools.wraps(fn)(functools.partial(_run_task, fn, owns_folder))

    return decorate


def _run_task(fn: Callable[[Any], Any], owns_folder: bool, cfg: Any) -> Any:
    folder = run_dir()
    fresh = _untouched(folder)  # the folder was made for this run (or holds nothing)
    try:
        return fn(cfg)
    except ConfigError as err:
        report(err)
        log_to_file(f"error: {err}")
        if fresh and _untouched(folder):
            _close_file_logs(folder)
            shutil.rmtree(folder, ignore_errors=True)
        elif owns_folder and folder.is_dir():
            write_status(folder, "failed", error=str(err))
        if in_multirun():
            raise  # Hydra marks this job failed and goes on with the sweep's other jobs
        raise SystemExit(EXIT_BAD_INPUT) from None
    except Exception as err:
        log.exception("the run failed")  # the traceback, in the log file too
        if owns_folder and folder.is_dir() and not (fresh and _untouched(folder)):
            write_status(folder, "failed", error=f"{type(err).__name__}: {err}")
        raise


# ---------------------------------------------------------------------------------------------
# the command line


def _hydra_error_line(err: BaseException) -> str:
    """Hydra's multi-line message as one line; keeps the list of choices of a missing option."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, _, name = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={name} is not an option; choose one of: {', '.join(err.options)}"
    message = str(err)
    appended = re.search(r"Could not override '([^']+)'.*use (\+\S+)", message, re.S)
    if appended and "not in struct" in str(err.__cause__):
        key, add = appended.groups()
        return (
            f"{key}: there is no such key; check the spelling (to add a new key on purpose: {add})"
        )
    lines = [message]
    if err.__cause__ is not None:
        lines.append(str(err.__cause__))
    parts = []
    for text in lines:
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith(("full_key:", "object_type=", "See https://")):
                continue
            parts.append(line.rstrip("."))
    return "; ".join(dict.fromkeys(parts))


def resume_arguments(argv: list[str]) -> list[str]:
    """`python train.py resume=RUN_FOLDER` (or a checkpoint inside one) continues that run: in its
    folder, with the overrides it was started with (read from its .hydra/overrides.yaml), plus
    any given now (later ones win, so `trainer.max_steps=N` extends a run)."""
    args = argv[1:]
    value = next((a.split("=", 1)[1] for a in args if a.startswith("resume=")), None)
    if value in (None, "", "auto", "null", "None"):
        return argv
    if any(a in ("-m", "--multirun") for a in args):
        raise ConfigError(
            f"resume={value} continues one run; in a -m sweep use resume=auto with a fixed "
            "hydra.sweep.dir"
        )
    path = Path(value).expanduser()
    if not path.exists():
        raise ConfigError(f"resume={value} does not exist; pass a run folder or a .ckpt file")
    folder = path.parent.parent if path.is_file() and path.parent.name == "checkpoints" else path
    overrides_file = folder / ".hydra" / "overrides.yaml"
    if path.is_file() and not overrides_file.is_file():
        return argv  # a checkpoint outside a run folder: a new run starts from its state
    if not overrides_file.is_file():
        raise ConfigError(
            f"resume={value} is not a run folder (no .hydra/overrides.yaml); pass a run folder "
            "or a .ckpt file"
        )
    stored = yaml.safe_load(overrides_file.read_text()) or []
    skip = ("resume=", "hydra.run.dir=")
    stored = [o for o in stored if not o.startswith(skip)]
    extra = [] if any(a.startswith("hydra.run.dir=") for a in args) else [f"hydra.run.dir={folder}"]
    return [argv[0], *stored, *args, *extra]


def run_app(main: Callable[[], Any], resumable: bool = False) -> None:
    """Call a `@hydra.main` function with poslab's error handling (see the module doc)."""
    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises its errors; they are reported here
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        if resumable:
            sys.argv = resume_arguments(sys.argv)
        main()
    except ConfigError as err:  # raised again at the end of a sweep, or before Hydra started
        report(err)
        sys.exit(EXIT_BAD_INPUT)
    except (HydraException, OmegaConfBaseException) as err:
        if user_wants_traces:
            raise
        print(f"error: {_hydra_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)
    except ValueError as err:  # Hydra's own check of its flags (-m with --cfg) is a ValueError
        if user_wants_traces or "can be specified" not in str(err):
            raise
        print(f"error: {err}; run the command once per flag", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)


class CompareOnMultirunEnd(Callback):
    """Hydra callback: after a `-m` sweep, merge its jobs' results into <sweep>/comparison/.
    (Here, not in poslab.evaluation.compare, so Hydra can build it without importing torch.)"""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from poslab.evaluation.compare import compare, find_results

        sweep = Path(config.hydra.sweep.dir)
        if find_results([sweep]):
            compare([sweep], sweep / "comparison")
