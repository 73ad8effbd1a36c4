"""Positional schemes, one module each, all behind `PositionalScheme` (base.py).

The list of schemes is the folder conf/pos/ (one YAML file per scheme, whose `_target_` names its
class): tests, the benchmark and the recipes take it from `scheme_configs()`, so adding a scheme
is one module here and one YAML file there. Options several schemes share (randomized positions,
the position dtype, the rotary options) live once, in conf/pos/_shared/, which a scheme's file
lists in its Hydra defaults list; `scheme_yaml` composes a file the same way without Hydra.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked
from poslab.positions.base import PositionalScheme

if TYPE_CHECKING:
    from omegaconf import DictConfig

POS_CONF = Path(__file__).resolve().parents[1] / "conf" / "pos"
HERE = "@_here_"  # the package of a shared file: merged into the scheme's own node


def shipped_scheme_names() -> list[str]:
    """Every scheme of poslab's conf/pos/, by file name (conf/pos/_shared/ holds no scheme)."""
    return sorted(p.stem for p in POS_CONF.glob("*.yaml"))


def scheme_files() -> dict[str, Path]:
    """name -> its YAML file: poslab's, then a researcher's own (POSLAB_USER, poslab/user.py)."""
    from poslab.user import user_scheme_files

    shipped = {p.stem: p for p in POS_CONF.glob("*.yaml")}
    return {**shipped, **user_scheme_files(set(shipped))}


def scheme_names() -> list[str]:
    """Every scheme: poslab's conf/pos/ and the user's folders (POSLAB_USER)."""
    return sorted(scheme_files())


def scheme_yaml(name: str) -> DictConfig:
    """conf/pos/<name>.yaml with its defaults list applied as Hydra applies it, unresolved
    (`${data.seq_len}` stays): for readers that load the configs with OmegaConf alone."""
    path = scheme_files().get(name)
    if path is None:
        raise ConfigError(f"no scheme {name!r}; choose one of {', '.join(scheme_names())}")
    return _compose(path)


def _compose(path: Path) -> DictConfig:
    """The file's own keys and the files of its defaults list, merged in the list's order
    (`_self_` where it stands, else last). Only what conf/pos/ uses is understood: entries
    `_self_` and `PATH@_here_`, a path relative to the file's folder."""
    from omegaconf import OmegaConf

    own = OmegaConf.load(path)
    defaults = own.pop("defaults", None)
    if defaults is None:
        return own
    entries = list(defaults) if "_self_" in defaults else [*defaults, "_self_"]
    composed = OmegaConf.create()
    for entry in entries:
        if entry == "_self_":
            part = own
        elif isinstance(entry, str) and entry.endswith(HERE):
            relative = f"{entry.removesuffix(HERE)}.yaml"
            # a user's scheme lists poslab's shared files (_shared/...), as Hydra finds them
            own = path.parent / relative
            part = _compose(own if own.is_file() else POS_CONF / relative)
        else:
            raise ValueError(
                f"{path}: defaults entry {entry!r}; a scheme's file lists _self_ and shared "
                f"files as PATH{HERE}"
            )
        composed = OmegaConf.merge(composed, part)
    return composed


def scheme_configs(seq_len: int = 64) -> dict[str, dict[str, Any]]:
    """name -> the scheme's resolved config (options that follow the training length, such as
    learned's table size, resolved for `seq_len`)."""
    from omegaconf import OmegaConf

    configs = {}
    for name, path in sorted(scheme_files().items()):  # the folders read once, not per scheme
        root = OmegaConf.create({"data": {"seq_len": seq_len}})
        root.pos = _compose(path)
        configs[name] = OmegaConf.to_container(root.pos, resolve=True)
    return configs


def scheme_class(name: str) -> type[PositionalScheme]:
    """The class a scheme of conf/pos/ builds (its `_target_`): for what it declares without
    being built, such as `shift_invariant`."""
    from hydra.utils import get_class

    return get_class(scheme_yaml(name)["_target_"])


def build_scheme(name: str, d_model: int, n_head: int, seq_len: int = 64, **options: Any) -> Any:
    """A scheme of conf/pos/ by name, with `options` over its YAML defaults."""
    config = {**scheme_configs(seq_len)[name], **options}
    return instantiate_checked(config, d_model=d_model, n_head=n_head)


__all__ = [
    "PositionalScheme",
    "build_scheme",
    "scheme_class",
    "scheme_configs",
    "scheme_files",
    "scheme_names",
    "scheme_yaml",
]
