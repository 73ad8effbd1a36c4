"""Positional schemes, one module each, all behind `PositionalScheme` (base.py).

The list of schemes is the folder conf/pos/ (one YAML file per scheme, whose `_target_` names its
class): tests, the benchmark and the recipes take it from `scheme_configs()`, so adding a scheme
is one module here, one YAML file there, and its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.instantiate import instantiate_checked
from poslab.positions.base import PositionalScheme

POS_CONF = Path(__file__).resolve().parents[1] / "conf" / "pos"


def scheme_names() -> list[str]:
    """Every scheme of conf/pos/, by file name."""
    return sorted(p.stem for p in POS_CONF.glob("*.yaml"))


def scheme_configs(seq_len: int = 64) -> dict[str, dict[str, Any]]:
    """name -> the scheme's resolved config (options that follow the training length, such as
    learned's table size, resolved for `seq_len`)."""
    from omegaconf import OmegaConf

    configs = {}
    for name in scheme_names():
        root = OmegaConf.create({"data": {"seq_len": seq_len}})
        root.pos = OmegaConf.load(POS_CONF / f"{name}.yaml")
        configs[name] = OmegaConf.to_container(root.pos, resolve=True)
    return configs


def build_scheme(name: str, d_model: int, n_head: int, seq_len: int = 64, **options: Any) -> Any:
    """A scheme of conf/pos/ by name, with `options` over its YAML defaults."""
    config = {**scheme_configs(seq_len)[name], **options}
    return instantiate_checked(config, d_model=d_model, n_head=n_head)


__all__ = [
    "PositionalScheme",
    "build_scheme",
    "scheme_configs",
    "scheme_names",
]
