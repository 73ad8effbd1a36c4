"""Check primitives: a check returns what is wrong with a value (or None), and `require` /
`check_schema` turn the first problem into a one-line ConfigError naming the option.

The ground floor of the package (it imports nothing of poslab but errors): every scheme, task
and kernel checks its own arguments with these, and validate.py builds the run's schemas on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from poslab.errors import ConfigError

Check = Callable[[Any], "str | None"]
_ABSENT = object()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def integer(low: int | None = None, high: int | None = None, null: bool = False) -> Check:
    """An integer in [low, high] (or null when `null`)."""

    def check(value: Any) -> str | None:
        if value is None and null:
            return None
        bounds = f" ≥ {low}" if low is not None else ""
        bounds += f" and ≤ {high}" if high is not None else ""
        wanted = f"an integer{bounds}" + (" or null" if null else "")
        if not is_int(value):
            return f"must be {wanted}"
        if (low is not None and value < low) or (high is not None and value > high):
            return f"must be {wanted}"
        return None

    return check


def number(
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    null: bool = False,
) -> Check:
    """A finite number within the given bounds (or null when `null`)."""
    parts = [f"> {gt:g}" if gt is not None else "", f"≥ {ge:g}" if ge is not None else ""]
    parts += [f"< {lt:g}" if lt is not None else "", f"≤ {le:g}" if le is not None else ""]
    wanted = "a finite number " + " and ".join(p for p in parts if p) + (" or null" if null else "")

    def check(value: Any) -> str | None:
        if value is None and null:
            return None
        if not is_number(value) or not math.isfinite(value):
            return f"must be {wanted.strip()}"
        if (
            (gt is not None and value <= gt)
            or (ge is not None and value < ge)
            or (lt is not None and value >= lt)
            or (le is not None and value > le)
        ):
            return f"must be {wanted.strip()}"
        return None

    return check


def choice(*options: Any) -> Check:
    def check(value: Any) -> str | None:
        return None if value in options else f"is not one of {', '.join(map(shown, options))}"

    return check


def boolean(null: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or (value is None and null):
            return None
        return "must be true or false" + (" (or null)" if null else "")

    return check


def text(null: bool = False) -> Check:
    """A name, path or id: text (a number typed where a name goes is refused too, since a list
    or a mapping there fails only when the run folder's name is written)."""

    def check(value: Any) -> str | None:
        if isinstance(value, str) and value or (value is None and null):
            return None
        return "must be a text" + (" (or null)" if null else "")

    return check


def list_of(item: Check, nonempty: bool = True, null: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if value is None and null:
            return None
        if not isinstance(value, list | tuple | ListConfig):
            return "must be a list, e.g. [1,2,4]"
        if nonempty and len(value) == 0:
            return "must not be empty"
        for entry in value:
            if (problem := item(entry)) is not None:
                return f"has {entry!r}, which {problem}"
        return None

    return check


def check_schema(cfg: Any, schema: dict[str, Check]) -> None:
    """Raise ConfigError for the first key whose value fails its check."""
    for key, check in schema.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT) if _is_config(cfg) else _get(cfg, key)
        if value is _ABSENT:
            continue
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"{key}={shown(value)} {problem}")


def _is_config(cfg: Any) -> bool:
    return isinstance(cfg, DictConfig)


def _get(cfg: dict, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def shown(value: Any) -> str:
    """A value as the user typed it on the command line (Hydra's syntax, not Python's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value)


def require(key: str, value: Any, check: Check) -> None:
    """One option checked where it is used (a scheme's constructor): ConfigError naming `key`."""
    problem = check(value)
    if problem is not None:
        raise ConfigError(f"{key}={shown(value)} {problem}")
