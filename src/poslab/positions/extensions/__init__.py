"""Eval-time RoPE context extensions, one module each, all behind `Extension` (base.py).

The list of kinds is the folder conf/extension/ (one YAML file per kind, whose `_target_` names
its class and whose keys are its options' defaults): `eval.rope_scaling.kind=NAME` picks one,
so adding a kind is one module here and one YAML file there (tests/e2e/test_new_kind.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension

EXTENSION_CONF = Path(__file__).resolve().parents[2] / "conf" / "extension"


def extension_names() -> tuple[str, ...]:
    """Every kind of conf/extension/, by file name, `none` first."""
    names = sorted(p.stem for p in EXTENSION_CONF.glob("*.yaml"))
    return tuple(sorted(names, key=lambda n: n != "none"))


def extension_defaults(kind: Any) -> tuple[type[Extension], dict[str, Any]]:
    """(the class, the option defaults) of conf/extension/<kind>.yaml; a ConfigError naming the
    kinds for a name that is none of them."""
    if not isinstance(kind, str) or kind not in extension_names():
        raise ConfigError(
            f"eval.rope_scaling.kind={kind!r}; choose one of {', '.join(extension_names())}"
        )
    cls, defaults = _read_extension(kind)
    return cls, dict(defaults)


@functools.cache
def _read_extension(kind: str) -> tuple[type[Extension], dict[str, Any]]:
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    path = EXTENSION_CONF / f"{kind}.yaml"
    options = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    cls = get_class(options.pop("_target_"))
    if not (isinstance(cls, type) and issubclass(cls, Extension)):
        raise ConfigError(f"{path}: _target_ must name an Extension subclass (base.py)")
    return cls, options


def option_owners() -> dict[str, list[str]]:
    """option -> the kinds that read it (for checking an option the chosen kind does not)."""
    owners: dict[str, list[str]] = {}
    for kind in extension_names():
        for option in extension_defaults(kind)[0].option_names():
            owners.setdefault(option, []).append(kind)
    return owners
