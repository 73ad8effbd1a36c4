"""Positional schemes, one module each, all behind `PositionalScheme` (base.py).

The list of schemes is the folder conf/pos/ (one YAML file per scheme, whose `_target_` names its
class): tests, the benchmark and the recipes take it from `scheme_configs()`, so adding a scheme
is one module here, one YAML file there, and its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.positions.base import PositionalScheme

POS_CONF = Path(__file__).resolve().parents[3] / "conf" / "pos"


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


def eval_variant_options(eval_cfg: Any) -> dict[str, Any] | None:
    """The eval-time RoPE context extension asked for (eval.rope_scaling, eval.logn_scaling),
    checked, with `factor` as given (a number or `auto`); None when none is."""
    from poslab.errors import ConfigError
    from poslab.positions.rope_scaling import RopeScaling
    from poslab.validate import boolean, require

    eval_cfg = _plain(eval_cfg)
    given = dict(eval_cfg.get("rope_scaling") or {})
    logn = eval_cfg.get("logn_scaling", False)
    require("eval.logn_scaling", logn, boolean())
    for key, instead in (("logn", "eval.logn_scaling"), ("train_length", "nothing: it is the "
                         "checkpoint's data.seq_len")):  # fmt: skip
        if key in given:
            raise ConfigError(f"eval.rope_scaling.{key} is not an option; set {instead}")
    options = {**given, "logn": logn}
    factor = options.get("factor", "auto")
    if factor != "auto":  # checked now; `auto` is resolved per evaluation length
        require("eval.rope_scaling.factor", factor, _factor_check)
    try:
        RopeScaling(**{**options, "factor": 1.0, "train_length": 1})  # every other option
    except TypeError as err:
        raise ConfigError(f"eval.rope_scaling: {err}") from None
    return None if options.get("kind", "none") == "none" and not logn else options


def _plain(cfg: Any) -> Any:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def _factor_check(value: Any) -> str | None:
    from poslab.validate import number

    problem = number(ge=1)(value)
    return None if problem is None else f"{problem} or auto (= eval length / training length)"


def eval_variant_label(eval_cfg: Any) -> str:
    """A short name of the eval-time variant for tables (`yarn s=auto +logn`), or ''."""
    options = eval_variant_options(eval_cfg)
    if options is None:
        return ""
    from poslab.positions.rope_scaling import RopeScaling

    factor = options.get("factor", "auto")
    shown = "auto" if factor == "auto" else f"{float(factor):g}"
    return RopeScaling(**{**options, "factor": 1.0, "train_length": 1}).label(shown)


def eval_overrides(
    eval_cfg: Any, pos_cfg: dict[str, Any], length: int, train_length: int
) -> dict[str, Any]:
    """The scheme options an evaluation at `length` changes: eval.pos_overrides, plus the
    `scaling` option of the eval-time RoPE context extension with its factor for this length
    (left out where it is the identity: a factor of 1 for pi, ntk and yarn)."""
    from hydra.utils import get_class

    from poslab.build import scheme_options
    from poslab.errors import ConfigError
    from poslab.positions.rope_scaling import RopeScaling, resolve_factor

    eval_cfg = _plain(eval_cfg)
    overrides = dict(eval_cfg.get("pos_overrides") or {})
    options = eval_variant_options(eval_cfg)
    if options is None:
        return overrides
    scheme = get_class(pos_cfg["_target_"])
    # a multi-axis rotary scheme (mrope, rope2d) inherits the option but refuses it: said here
    # in the user's keys, not as the scheme's internal pos.scaling
    multi_axis = "scaling" in scheme_options(pos_cfg) and not getattr(scheme, "eval_scaling", True)
    if "scaling" not in scheme_options(pos_cfg) or multi_axis:
        kind = options.get("kind", "none")
        asked = [f"eval.rope_scaling.kind={kind}"] if kind != "none" else []
        asked += ["eval.logn_scaling=true"] if options.get("logn") else []
        why = ", whose rotary pairs each read one position axis" if multi_axis else ""
        raise ConfigError(
            f"{' and '.join(asked)}: eval.rope_scaling and eval.logn_scaling act on rotary "
            f"schemes (rope, xpos), not on {scheme.__name__}{why}; set "
            "eval.rope_scaling.kind=none and eval.logn_scaling=false"
        )
    factor = resolve_factor(options.get("kind", "none"), options.get("factor", "auto"), length,
                            train_length)  # fmt: skip
    scaling = {**options, "factor": factor, "train_length": train_length}
    if not RopeScaling(**scaling).is_identity():  # the identity: the trained model itself
        overrides["scaling"] = scaling
    return overrides


def build_scheme(name: str, d_model: int, n_head: int, seq_len: int = 64, **options: Any) -> Any:
    """A scheme of conf/pos/ by name, with `options` over its YAML defaults."""
    from poslab.build import instantiate_checked

    config = {**scheme_configs(seq_len)[name], **options}
    return instantiate_checked(config, d_model=d_model, n_head=n_head)


__all__ = [
    "PositionalScheme",
    "build_scheme",
    "eval_overrides",
    "eval_variant_label",
    "eval_variant_options",
    "scheme_configs",
    "scheme_names",
]
