"""What poslab's model code takes from Hydra and OmegaConf, for an exported folder that has
neither (poslab's export writes this file beside the model code, poslab/hf/bundle.py): building
a config node's `_target_` from the folder's modules, and reading plain dicts as OmegaConf reads
its nodes. poslab's configs are plain dicts here, so nothing is ever a DictConfig."""

from __future__ import annotations

import copy
import importlib
from typing import Any


class InstantiationException(Exception):  # noqa: N818 (Hydra's name)
    pass


class DictConfig:  # never instantiated: isinstance(x, DictConfig) is False for plain dicts
    pass


class ListConfig:
    pass


class OmegaConf:
    @staticmethod
    def to_container(node: Any, resolve: bool = True) -> Any:
        return copy.deepcopy(node)

    @staticmethod
    def select(node: Any, key: str, default: Any = None) -> Any:
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def get_class(path: str) -> Any:
    """`poslab.a.b.Name` from the folder's module poslab_a_b (anything else as Hydra would)."""
    module, name = path.rsplit(".", 1)
    if module == "poslab" or module.startswith("poslab."):
        return getattr(importlib.import_module("." + module.replace(".", "_"), __package__), name)
    return getattr(importlib.import_module(module), name)


def instantiate(config: Any, **kwargs: Any) -> Any:
    """Hydra's instantiate for plain dicts: nested nodes with a `_target_` are built first."""
    if isinstance(config, dict):
        built = {k: instantiate(v) for k, v in config.items() if k != "_target_"}
        if "_target_" not in config:
            return {**built, **kwargs}
        return get_class(config["_target_"])(**built, **kwargs)
    if isinstance(config, list):
        return [instantiate(v) for v in config]
    return config
