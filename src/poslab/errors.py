"""User-facing errors: one clear line that says what to change, never a deep stack trace."""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# the exit code of every bad-input error (a config, a corpus, a checkpoint, a diverged run)
EXIT_BAD_INPUT = 2


class ConfigError(ValueError):
    """Bad input from the user (config, data, checkpoint). The message says what to change."""

    reported = False  # set once the line has been printed (a sweep re-raises it at its end)


class TrainingDiverged(ConfigError):
    """The loss or the weights became non-finite: the run stops at once (its hyperparameters,
    usually the learning rate or a scheme option, are the input to change)."""


def require_extra(module: str, extra: str, purpose: str) -> None:
    """`module` importable, or a ConfigError naming the extra of poslab that installs it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f'{purpose} needs {module}, which is not installed; pip install "poslab[{extra}]"'
        ) from None


def report(err: ConfigError) -> None:
    """Print `error: <message>` on stderr, once."""
    if not err.reported:
        print(f"error: {err}", file=sys.stderr, flush=True)
        err.reported = True


def exit_on_config_error(fn: F) -> F:
    """For scripts without Hydra: a ConfigError raised anywhere below `fn` becomes
    `error: <message>` on stderr and exit code 2. (Hydra entry points use poslab.run.cli.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            report(err)
            raise SystemExit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


class DiskFull(ConfigError):
    """A write failed for lack of space (a full disk, a quota, a file-size limit). The message
    names the path and the space needed; what was written before is intact."""


# the errnos of "no room to write": a full disk, a quota, a file-size limit (RLIMIT_FSIZE)
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class RunInterrupted(BaseException):
    """SIGTERM or SIGINT stopped a phase of a run (a BaseException, like KeyboardInterrupt, so
    that no `except Exception` swallows it). `saved` is what was kept (a checkpoint), if any."""

    def __init__(self, signum: int, phase: str, step: int | None = None, saved: str | None = None):
        super().__init__(signum, phase)
        self.signum, self.phase, self.step, self.saved = signum, phase, step, saved


class RunBusy(ConfigError):
    """Another training process holds the run folder's lock: the refused process touches
    nothing there (not even what a refusal would tidy: that is the holder's)."""
