"""User-facing errors: one clear line that says what to change, never a deep stack trace."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class ConfigError(ValueError):
    """Bad input from the user (config, data, checkpoint). The message says what to change."""


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def exit_on_config_error(fn: F) -> F:
    """Turn a ConfigError raised anywhere below `fn` into `error: <message>` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            if _in_multirun():
                raise  # Hydra marks this job failed and goes on with the sweep's other jobs
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]
