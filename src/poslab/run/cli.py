"""What train.py and eval.py share around Hydra: errors as one line with exit code 2, run folders
that say how the run ended, and `resume=RUN` continuing a run in its own folder.

* Hydra's own errors (an unknown option `pos=foo`, a misspelled key `pos.bsae=500`, bad override
  syntax) become one line and exit code 2, like poslab's ConfigError.
* A run that fails on bad input before any work leaves no folder behind; one that fails later
  keeps its folder, whose `train.log` ends with the error line and whose `status.json` says
  `failed` (or `interrupted`, with the command that resumes it).
* A refused command never writes to the run it names: Hydra records a command in
  `.hydra-pending/` (conf/hydra/default.yaml), which becomes the run's `.hydra/` only once the run
  passed its checks and took the folder (`claim_run_folder`); a refusal removes it and the log
  lines it added, so `resume=RUN pos=alibi` leaves RUN exactly as it was.
* One training process at a time per run folder (`RunLock`, a lock on `<run>/.lock`); a second
  is refused in one line naming the holder's pid.
* SIGTERM / SIGINT in any phase (setup, training, the evaluation after it, eval.py, a sweep)
  end in one line and a status file that say what finished and what to run next.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from poslab.errors import (
    EXIT_BAD_INPUT,
    NO_SPACE_ERRNOS,
    ConfigError,
    RunBusy,
    RunInterrupted,
    report,
)
from poslab.run import run_folder
from poslab.run.run_folder import (
    PENDING_CONFIG,
    STATUS_KEYS,
    RunLock,
    in_multirun,
    is_main_process,
    pending_record,
    read_status,
    resume_command,
    run_dir,
    untouched,
    write_status,
)

log = logging.getLogger(__name__)

# eval.py's record in the folder it logs to, written when it is interrupted (and its next run)
EVAL_STATUS = "eval_status.json"
# the command line as the user typed it (before resume= rewrote it): sweeps print it back
_ORIGINAL_ARGV: list[str] = []
# run_app is the process's entry: a stopped job's exit ends the process
_PROCESS_ENDS_ON_STOP = [False]


def os_error_line(err: OSError) -> str | None:
    """One line for the errors of the machine a user can fix (no permission, a read-only place,
    no room left); None for others (a bug: a traceback, in the log file too)."""
    where = err.filename or "a file"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write {where} ({err.strerror}); make it writable or choose another place "
            "(hydra.run.dir=, out_dir=, POSLAB_CACHE=, HOME for W&B)"
        )
    if err.errno in NO_SPACE_ERRNOS:
        free = shutil.disk_usage(Path(where).parent).free if err.filename else None
        room = f", {free / 2**20:.1f} MiB free" if free is not None else ""
        return f"no room to write {where} ({err.strerror}{room}); free some space"
    return None


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
    from poslab.run.console import quiet_libraries

    quiet_libraries()  # after Hydra set up logging: Lightning once, no library small talk
    folder = run_dir()
    fresh = untouched(folder)  # the folder was made for this run (or holds nothing)
    run_folder.forget_claim()
    logs = _log_sizes(folder)  # lines this job adds are taken back if it is refused
    lock = RunLock(folder) if owns_folder and is_main_process() else None
    handlers = _stop_on_signals()
    stopped = False
    try:
        if lock is not None:
            lock.acquire()
        result = fn(cfg)
        if owns_folder and run_folder.claimed_folder() is None and is_main_process():
            _undo_refused(folder, fresh, logs, lock)  # it had nothing to do (a finished run)
        if not owns_folder and (folder / EVAL_STATUS).is_file():
            # an eval.py that ran again after an interruption: the record says it finished
            _try(write_status, folder, "completed", name=EVAL_STATUS)
        return result
    except RunInterrupted as stop:
        _ignore_stop_signals()  # an impatient second Ctrl-C must not cut the report short
        stopped = True
        if not is_main_process():  # rank 0 says it; a child's non-zero exit would kill rank 0
            raise SystemExit(0) from None
        _interrupted(stop, folder, owns_folder, fresh, logs, lock)
        raise SystemExit(128 + stop.signum) from None
    except ConfigError as err:
        _failed(err, folder, owns_folder, fresh, logs, lock)
        if in_multirun():
            raise  # Hydra marks this job failed and goes on with the sweep's other jobs
        raise SystemExit(EXIT_BAD_INPUT) from None
    except OSError as err:
        line = os_error_line(err)
        if line is None:
            _crashed(err, folder, owns_folder, fresh, logs, lock)
            raise
        _failed(ConfigError(line), folder, owns_folder, fresh, logs, lock)
        if in_multirun():
            raise ConfigError(line) from None
        raise SystemExit(EXIT_BAD_INPUT) from None
    except Exception as err:
        _crashed(err, folder, owns_folder, fresh, logs, lock)
        raise
    finally:
        # A process that ends now keeps ignoring them: put back, Python's handler would turn a
        # Ctrl-C that lands during the exit into a KeyboardInterrupt (killed by SIGINT, not 130)
        if not (stopped and _PROCESS_ENDS_ON_STOP[0]):
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        if lock is not None:
            lock.release()


def _log_sizes(folder: Path) -> dict[Path, int]:
    """The size of each of this job's log files in `folder` now."""
    sizes = {}
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            path = Path(handler.baseFilename)
            if path.parent == folder:
                sizes[path] = path.stat().st_size if path.is_file() else 0
    return sizes


def _failed(
    err: ConfigError,
    folder: Path,
    owns_folder: bool,
    fresh: bool,
    logs: dict[Path, int],
    lock: RunLock | None,
) -> None:
    report(err)
    if isinstance(err, RunBusy):  # the folder is the holder's: only our own record goes
        shutil.rmtree(pending_record(folder), ignore_errors=True)
        return
    if owns_folder and run_folder.claimed_folder() is None and is_main_process():
        _undo_refused(folder, fresh, logs, lock)
        return
    _try(log_to_file, f"error: {err}")
    if fresh and untouched(folder):
        _close_file_logs(folder)
        shutil.rmtree(folder, ignore_errors=True)
    elif owns_folder and folder.is_dir():
        _try(write_status, folder, "failed", **_kept_metrics(folder), error=str(err))


def _kept_metrics(folder: Path) -> dict[str, Any]:
    """The metrics the run's status holds (a later status keeps them: a failed retry of an
    interrupted evaluation must not lose the training's numbers)."""
    return {k: v for k, v in read_status(folder).items() if k not in STATUS_KEYS}


def _undo_refused(folder: Path, fresh: bool, logs: dict[Path, int], lock: RunLock | None) -> None:
    """A refused command leaves the folder it named as it found it: a folder made for it is
    removed; an existing run loses Hydra's record of the refused command and its log lines."""
    if fresh and untouched(folder):
        _close_file_logs(folder)
        shutil.rmtree(folder, ignore_errors=True)
        return
    shutil.rmtree(pending_record(folder), ignore_errors=True)
    for path, size in logs.items():
        with contextlib.suppress(OSError):
            if size == 0:
                path.unlink(missing_ok=True)
            else:
                os.truncate(path, size)
    if lock is not None:
        with contextlib.suppress(OSError):
            lock.put_back()


def _crashed(
    err: BaseException,
    folder: Path,
    owns_folder: bool,
    fresh: bool,
    logs: dict[Path, int],
    lock: RunLock | None,
) -> None:
    log.exception("the run failed")  # the traceback (in the log file too, once claimed)
    if owns_folder and run_folder.claimed_folder() is None and is_main_process():
        _undo_refused(folder, fresh, logs, lock)  # it had not started: the run is as it was
    elif owns_folder and folder.is_dir() and not (fresh and untouched(folder)):
        _try(
            write_status,
            folder,
            "failed",
            **_kept_metrics(folder),
            error=f"{type(err).__name__}: {err}",
        )


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM / SIGINT raise RunInterrupted wherever the job is (training installs its own
    handler, which finishes the step and saves first). Returns the handlers to put back."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: Any) -> None:
        _ignore_stop_signals()  # one stop at a time: its report must not be cut short
        raise RunInterrupted(signum, phase="")

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, stop)
    return previous


def _ignore_stop_signals() -> None:
    """SIGTERM / SIGINT ignored until the job's handlers are put back (its `finally`)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)


def _interrupted(
    stop: RunInterrupted,
    folder: Path,
    owns_folder: bool,
    fresh: bool,
    logs: dict[Path, int],
    lock: RunLock | None,
) -> None:
    """One line (and the status file) saying what finished and what to run next."""
    _clear_progress_bars()
    name = signal.Signals(stop.signum).name
    if not owns_folder:  # eval.py: results are written together at the end, so none were
        line = (
            f"stopped by {name} during the evaluation; no results were written; run the same "
            f"command again: {_command(_ORIGINAL_ARGV)}"
        )
        _try(write_status, folder, "interrupted", name=EVAL_STATUS, next=line)
    elif (
        run_folder.claimed_folder() is None
    ):  # before the run took its folder: nothing of it was written
        _undo_refused(folder, fresh, logs, lock)
        line = f"stopped by {name} before the run started; nothing was written"
        print(line, file=sys.stderr, flush=True)
        if in_multirun():
            _sweep_interrupted(name, owns_folder)
        return
    else:
        resume = resume_command(folder)
        if stop.phase == "training":
            done = f"at step {stop.step}; saved {stop.saved}"
        elif stop.phase == "evaluation":
            done = f"in the evaluation after training (training finished: {stop.saved})"
        else:
            done = "before training started" + (
                f" (last checkpoint {stop.saved})" if stop.saved else ""
            )
        line = f"stopped by {name} {done}; resume with: {resume}"
        # the metrics the running status held (training's, when the evaluation was stopped)
        prior = read_status(folder)
        kept = {k: v for k, v in prior.items() if k not in STATUS_KEYS}
        step = stop.step if stop.step is not None else prior.get("step")
        _try(
            write_status,
            folder,
            "interrupted",
            **{**kept, "phase": stop.phase or "setup", "step": step, "resume": resume},
        )
    print(line, file=sys.stderr, flush=True)
    _try(log_to_file, line)
    if in_multirun():
        _sweep_interrupted(name, owns_folder)


def _clear_progress_bars() -> None:
    """A bar the stop caught mid-loop is still on the line; cleared, the stop line is one of
    its own (it is the last line the user sees, and what scripts read)."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()


def _try(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(OSError):  # the folder cannot take it (read-only, full): the
        fn(*args, **kwargs)  # line was printed


def _command(argv: list[str]) -> str:
    """The user's command again, as typed (the script path as given, so it runs from where they
    ran it)."""
    return " ".join(["python", *map(shlex.quote, argv or ["train.py"])])


def _sweep_interrupted(signal_name: str, resumable: bool) -> None:
    """A -m sweep stopped in job k: name the jobs that did not run and print the command that
    resumes the whole sweep (finished jobs are skipped, the stopped one continues)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    sweep = Path(hydra_cfg.sweep.dir).resolve()
    job = int(hydra_cfg.job.num)
    total = _sweep_size(sweep)
    args = [a for a in _ORIGINAL_ARGV[1:] if not a.startswith(("hydra.sweep.dir=", "resume="))]
    # a training sweep continues in its folder; an eval.py sweep simply runs again
    again = ["resume=auto", f"hydra.sweep.dir={sweep}"] if resumable else []
    command = _command([_ORIGINAL_ARGV[0] if _ORIGINAL_ARGV else "train.py", *args, *again])
    if total is None:
        not_run = f"the jobs after job {job} did not run"
        left: list[int] | None = None
    else:
        left = list(range(job + 1, total))
        not_run = (
            f"jobs {left[0]}–{left[-1]} of 0–{total - 1} did not run"
            if len(left) > 1
            else f"job {left[0]} of 0–{total - 1} did not run"
            if left
            else "it was the sweep's last job"
        )
    line = f"sweep stopped by {signal_name} in job {job}; {not_run}; resume it with: {command}"
    print(line, file=sys.stderr, flush=True)
    _try(write_status, sweep, "interrupted", job=job, jobs_not_run=left, resume=command)


def _sweep_size(sweep: Path) -> int | None:
    """The number of jobs of the sweep (from its multirun.yaml, as Hydra's basic sweeper
    expands it); None where that cannot be read."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        saved = OmegaConf.load(sweep / "multirun.yaml")
        params = saved.hydra.sweeper.get("params") or {}
        overrides = [f"{k}={v}" for k, v in params.items()] + list(saved.hydra.overrides.task)
        parsed = OverridesParser.create().parse_overrides(overrides)
        return sum(len(batch) for batch in BasicSweeper.split_arguments(parsed, None))
    except Exception:  # an unusual sweeper: the line says "the jobs after"
        return None


# ---------------------------------------------------------------------------------------------
# the command line


def _scheme_without_positions() -> str | None:
    """The class name of the command line's pos= scheme where it reads no positions, else
    None (the default scheme, rope, reads them)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    chosen = [a.split("=", 1)[1] for a in _ORIGINAL_ARGV[1:] if a.startswith("pos=")]
    if not chosen:
        return None
    path = Path(__file__).resolve().parents[1] / "conf" / "pos" / f"{chosen[-1]}.yaml"
    if not path.is_file():
        return None
    try:
        scheme = get_class(OmegaConf.load(path)["_target_"])
    except Exception:  # an unreadable scheme file: the plain "no such key" line  # noqa: BLE001
        return None
    return None if getattr(scheme, "reads_positions", True) else scheme.__name__


def hydra_error_line(err: BaseException) -> str:
    """Hydra's multi-line message as one line; keeps the list of choices of a missing option."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, _, name = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={name} is not an option; choose one of: {', '.join(err.options)}"
    message = str(err)
    appended = re.search(r"Could not override '([^']+)'.*use (\+\S+)", message, re.S)
    if appended and "not in struct" in str(err.__cause__):
        key, add = appended.groups()
        full = re.search(r"full_key: (\S+)", str(err.__cause__))
        if key.startswith("pos.scaling."):  # extend='s train-time extension: a new key
            return f"pos.scaling takes a mapping of new keys; write it with a leading +: {add}"
        if key == "pos.randomize_max" and (scheme := _scheme_without_positions()):
            # its YAML leaves the shared option out because the scheme reads no positions:
            # say that first, not "no such key" (which, taken, leads to this line anyway)
            return (
                f"pos.randomize_max: {scheme} reads no positions, so it has no randomize_max "
                "to set; drop the option"
            )
        if full and full.group(1).startswith(key + "."):
            # the option exists and takes a mapping (eval.pos_overrides, pos.options): its keys
            # are new ones, which Hydra adds only with a leading +
            return f"{key} takes a mapping of new keys; write it with a leading +: {add}"
        return (
            f"{key}: there is no such key; check the spelling (to add a new key on purpose: {add})"
        )
    if "LexerNoViableAlt" in message or "mismatched input" in message:
        # Hydra's parser stopped inside a value: spaces or ()[]{}!,= there need quotes (#43)
        odd = [
            a
            for a in _ORIGINAL_ARGV[1:]
            if "=" in a
            and set(a.split("=", 1)[1]) & set(" ()!")
            and a.split("=", 1)[1][:1] not in "'\"[{"
        ]
        which = f"the override {odd[0]!r}" if odd else "an override"
        return (
            f"cannot read {which}: quote a value with spaces or any of ()[]{{}}!,= in it, e.g. "
            "'data.path=\"/my data/(2024)\"'"
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
    if not overrides_file.is_file():  # killed before it took its folder: its pending record
        pending = sorted(folder.glob(f"{PENDING_CONFIG}*/overrides.yaml"), key=os.path.getmtime)
        overrides_file = pending[-1] if pending else overrides_file
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

    _ORIGINAL_ARGV[:] = sys.argv
    _PROCESS_ENDS_ON_STOP[0] = True
    try:
        from poslab.positions import scheme_names

        scheme_names()  # POSLAB_USER's folders checked (a bad one is one line, before Hydra)
        if resumable:
            from poslab.run.extend import extend_arguments

            sys.argv = extend_arguments(resume_arguments(sys.argv))
        main()
    except ConfigError as err:  # raised again at the end of a sweep, or before Hydra started
        report(err)
        sys.exit(EXIT_BAD_INPUT)
    except (HydraException, OmegaConfBaseException) as err:
        if user_wants_traces:
            raise
        print(f"error: {hydra_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)
    except OSError as err:  # Hydra could not make or write the run folder (after Hydra's
        # own errors: its MissingConfigException is an IOError)
        line = os_error_line(err)
        if line is None or user_wants_traces:
            raise
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)
    except ValueError as err:  # Hydra's own check of its flags (-m with --cfg) is a ValueError
        if user_wants_traces or "can be specified" not in str(err):
            raise
        print(f"error: {err}; run the command once per flag", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)
