"""Eval-time RoPE context extension: read past the training length L without retraining.

s is the scaling factor (L_eval / L_train, or fixed), R the rotated dims, θ_i = base^(−2i/R).
Each kind (pi, ntk, dynamic_ntk, yarn, llama3, longrope, rerope, selfextend, lminfinite) is a
module of positions/extensions/ with its maths and its references, and a file of
conf/extension/ with its options; `RopeScaling` is the `scaling` option a rotary scheme takes:
the kind built with its options, plus log-n:

* ``logn`` (Su; Qwen's ``use_logn_attn``), combinable with any kind: queries at position m are
  multiplied by max(1, log(m + 1)/log L), keeping the attention entropy of long inputs near the
  trained one. m counts from the window's first position (Qwen indexes the tokens of the
  context), and dynamic NTK's T is the window's span, so ``eval.position_offset`` changes
  neither. L is the training length (``data.seq_len``); for a model trained with randomized
  positions up to N, pass a fixed factor (its angles were trained up to N).

A factor of 1 (and kind ``none``) leaves the computation bit-identical to no scaling for pi,
ntk, yarn and llama3; longrope still applies its short factors (and its long ones past L).
rerope, selfextend and lminfinite ignore the factor: one model serves every length. Options
that are null in conf/eval/default.yaml take the kind's defaults (conf/extension/KIND.yaml), so
configs written before they existed still mean the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from poslab.checks import boolean, number, require
from poslab.errors import ConfigError
from poslab.instantiate import scheme_options
from poslab.positions.extensions import extension_defaults, extension_names, option_owners
from poslab.positions.extensions.base import Extension


def __getattr__(name: str) -> Any:
    """KINDS: the kinds of conf/extension/ (read when asked: a new kind's file is seen)."""
    if name == "KINDS":
        return extension_names()
    raise AttributeError(name)


COMMON = ("kind", "factor", "train_length", "logn")


class RopeScaling:
    """An eval-time extension as the scheme's `scaling` option: the kind (one module of
    positions/extensions/, built with its options; a null option is the kind's default, so
    configs written before an option existed keep their meaning), s, L and log-n. Every other
    attribute is the kind's (`scaling.window`, `scaling.yarn_ramp(...)`)."""

    def __init__(
        self,
        kind: str = "none",
        factor: float = 1.0,
        train_length: int = 0,
        logn: bool = False,
        **options: Any,
    ) -> None:
        cls, defaults = extension_defaults(kind)
        require("eval.rope_scaling.logn", logn, boolean())
        require("eval.rope_scaling.factor", factor, number(ge=1))
        own = set(cls.option_names())
        # the options of other kinds: checked, and kept readable as before (one class had all)
        self.others = check_others({k: v for k, v in options.items() if k not in own})
        given = {k: v for k, v in options.items() if k in own and v is not None}
        self.kind, self.logn = kind, logn
        self.method: Extension = cls(
            factor=factor, train_length=train_length, **{**defaults, **given}
        )

    @property
    def factor(self) -> float:
        return self.method.factor

    @property
    def train_length(self) -> int:
        return self.method.train_length

    def __getattr__(self, name: str) -> Any:
        if name in ("method", "others"):  # not built (yet): no recursion
            raise AttributeError(name)
        if hasattr(self.method, name):
            return getattr(self.method, name)
        owner = option_owners().get(name)
        if owner is None:
            raise AttributeError(name)
        # another kind's option: as given, else that kind's default
        value = self.others.get(name)
        return value if value is not None else owner_default(owner[0], name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RopeScaling) and self.options() == other.options()

    def __repr__(self) -> str:
        return f"RopeScaling({self.options()})"

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> RopeScaling | None:
        """The scaling of a scheme option (a mapping; None or kind none without logn: none)."""
        if not options:
            return None
        if not isinstance(options, Mapping):
            raise ConfigError(f"pos.scaling={options!r} must be a mapping of scaling options")
        scaling = cls(**dict(options))
        return None if scaling.is_identity() else scaling

    def options(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "factor": self.factor,
            "train_length": self.train_length,
            "logn": self.logn,
            **self.method.options(),
        }

    def is_identity(self) -> bool:
        """Whether it computes exactly what no scaling does (s = 1 for pi, ntk, yarn, llama3)."""
        return self.method.is_identity() and not self.logn

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        """The kind's frequencies θ'_i, or θ itself where it changes none (bit for bit)."""
        if not self.method.rescales_theta:
            return theta
        return self.method.theta(theta, rotary_dims, length, base)

    def query_scale(self, positions: Tensor) -> Tensor | None:
        """log-n: max(1, log(m + 1)/log L) per query (fp32), m counted from the first position
        of the window (…, T), or None."""
        if not self.logn:
            return None
        m = positions - positions.min(dim=-1, keepdim=True).values
        return (torch.log(m + 1) / math.log(self.train_length)).clamp(min=1.0)

    def label(self, factor: str | None = None) -> str:
        """A short name for tables, `yarn s=4 +logn`; `factor` shows it as given (`auto`)."""
        shown = factor or f"{self.factor:g}"
        parts = [self.kind, *self.method.label_parts(shown)] if self.method.named else []
        if self.logn:
            parts.append("+logn" if parts else "logn")
        return " ".join(parts)


def fine_tuned_label(scaling: dict[str, Any]) -> str:
    """The name tables give a train-time extension (a child of extend=): `yarn s=4, fine-tuned
    from L=128`, L its parent's training length."""
    return f"{RopeScaling(**scaling).label()}, fine-tuned from L={scaling['train_length']}"


def check_others(options: dict[str, Any]) -> dict[str, Any]:
    """Options the chosen kind does not read: each must be an option of some kind (else the
    list of options), and a value that kind would take (a typo'd value fails whatever the
    kind, as it did when every option lived in one class). Returns them."""
    owners = option_owners()
    for name, value in options.items():
        if name not in owners:
            known = ", ".join([*COMMON, *sorted(owners)])
            raise ConfigError(f"eval.rope_scaling has no option {name!r} (it has: {known})")
        if value is not None:
            owner, defaults = extension_defaults(owners[name][0])
            owner(**{**defaults, name: value})
    return options


def owner_default(kind: str, name: str) -> Any:
    """The default of option `name` of `kind`: its YAML's, else its class's."""
    cls, defaults = extension_defaults(kind)
    if defaults.get(name) is not None:
        return defaults[name]
    return cls.__dataclass_fields__[name].default


def resolve_factor(kind: str, factor: Any, eval_length: int, train_length: int) -> float:
    """eval.rope_scaling.factor for one evaluation length: `auto` is L_eval / L_train (at least
    1), except for dynamic_ntk, which reads the length itself (s = 1); none, rerope, selfextend
    and lminfinite ignore the factor (1: one model serves every length)."""
    cls = extension_defaults(kind)[0]
    if not cls.uses_factor:
        return 1.0
    if factor == "auto":
        if cls.auto_is_one:
            return 1.0
        return max(1.0, eval_length / train_length)
    require("eval.rope_scaling.factor", factor, number(ge=1))
    return float(factor)


# The eval-time variant asked for by an evaluation config (eval.rope_scaling, eval.logn_scaling)


def eval_variant_options(eval_cfg: Any) -> dict[str, Any] | None:
    """The eval-time RoPE context extension asked for (eval.rope_scaling, eval.logn_scaling),
    checked, with `factor` as given (a number or `auto`); None when none is."""

    eval_cfg = _plain(eval_cfg)
    given = dict(eval_cfg.get("rope_scaling") or {})
    logn = eval_cfg.get("logn_scaling", False)
    require("eval.logn_scaling", logn, boolean())
    set_elsewhere = {
        "logn": "eval.logn_scaling",
        "train_length": "nothing: it is the checkpoint's data.seq_len",
    }
    for key, instead in set_elsewhere.items():
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
    check_unread(options, "eval.rope_scaling")
    return None if options.get("kind", "none") == "none" and not logn else options


def check_unread(options: Mapping[str, Any], prefix: str) -> None:
    """An option the chosen kind does not read, set away from its default, changes nothing:
    refused, so that `kind=yarn shift=5` is not scored as plain yarn. (A value equal to its
    owner's default is what every recorded config holds, e.g. beta_fast 32: left alone.)"""
    kind = options.get("kind", "none")
    cls = extension_defaults(kind)[0]
    factor = options.get("factor", "auto")
    if not cls.uses_factor and factor not in ("auto", None):
        raise ConfigError(
            f"{prefix}.factor={factor}: kind={kind} reads no factor (one model serves every "
            f"length); leave {prefix}.factor out, or choose a kind that reads it"
        )
    own = set(cls.option_names())
    for name, value in options.items():
        owners = option_owners().get(name)
        if name in own or name in COMMON or value is None or owners is None:
            continue
        if any(value == owner_default(owner, name) for owner in owners):
            continue
        raise ConfigError(
            f"{prefix}.{name}={value} is an option of {', '.join(owners)}, which kind={kind} "
            f"does not read; leave it out, or set {prefix}.kind={owners[0]}"
        )


def _plain(cfg: Any) -> Any:

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def _factor_check(value: Any) -> str | None:

    problem = number(ge=1)(value)
    return None if problem is None else f"{problem} or auto (= eval length / training length)"


def _train_factor_check(value: Any) -> str | None:

    problem = number(ge=1)(value)
    return None if problem is None else f"{problem} or auto (= data.seq_len / the parent's)"


def eval_variant_label(eval_cfg: Any) -> str:
    """A short name of the eval-time variant for tables (`yarn s=auto +logn`), or ''."""
    options = eval_variant_options(eval_cfg)
    if options is None:
        return ""

    factor = options.get("factor", "auto")
    shown = "auto" if factor == "auto" else f"{float(factor):g}"
    return RopeScaling(**{**options, "factor": 1.0, "train_length": 1}).label(shown)


# the eval.* options that change the model, which eval_overrides reads (scripts/generate.py takes
# them as eval.py does)
EVAL_MODEL_KEYS = ("pos_overrides", "rope_scaling", "logn_scaling")


def eval_overrides(
    eval_cfg: Any, pos_cfg: dict[str, Any], length: int, train_length: int
) -> dict[str, Any]:
    """The scheme options an evaluation at `length` changes: eval.pos_overrides, plus the
    `scaling` option of the eval-time RoPE context extension with its factor for this length
    (left out where it is the identity: a factor of 1 for pi, ntk, yarn and llama3)."""

    eval_cfg = _plain(eval_cfg)
    overrides = dict(eval_cfg.get("pos_overrides") or {})
    options = eval_variant_options(eval_cfg)
    if options is None:
        return overrides
    trained = pos_cfg.get("scaling")
    if trained and not RopeScaling(**trained).is_identity():
        # a child of extend= fine-tuned with its scaling: another would replace it, not compose
        raise ConfigError(
            f"eval.rope_scaling: this checkpoint was fine-tuned with pos.scaling "
            f"kind={trained.get('kind')} s={trained.get('factor')} (extend=), which an eval-time "
            "kind would replace; set eval.rope_scaling.kind=none and eval.logn_scaling=false"
        )
    scaling = scaling_options(options, pos_cfg, length, train_length)
    if scaling is not None:  # the identity: the trained model itself
        overrides["scaling"] = scaling
    return overrides


def scaling_options(
    options: dict[str, Any],
    pos_cfg: dict[str, Any],
    length: int,
    train_length: int,
    train_time: bool = False,
) -> dict[str, Any] | None:
    """The `scaling` option a rotary scheme (`pos_cfg`) gets for the extension `options` (its
    kind, factor (a number or `auto`), own options, logn) at `length`, trained at
    `train_length`; None where it is the identity. One function for eval.rope_scaling and for
    the train-time pos.scaling of extend= (run/extend.py): the same model by construction."""
    _check_rotary(options, pos_cfg, train_time)
    kind, factor = options.get("kind", "none"), options.get("factor", "auto")
    factor = resolve_factor(kind, factor, length, train_length)
    scaling = {**options, "factor": factor, "train_length": train_length}
    built = RopeScaling(**scaling)
    # a kind's options read from a file (longrope's factors_file) are recorded as read
    return None if built.is_identity() else {**scaling, **built.method.resolved_options()}


def _check_rotary(options: dict[str, Any], pos_cfg: dict[str, Any], train_time: bool) -> None:
    """A scheme without the `scaling` option (no rotary pairs), or a multi-axis rotary one
    (mrope, rope2d: it inherits the option but refuses it), refused in the user's keys."""
    scheme = get_class(pos_cfg["_target_"])
    multi_axis = "scaling" in scheme_options(pos_cfg) and not getattr(scheme, "eval_scaling", True)
    if "scaling" in scheme_options(pos_cfg) and not multi_axis:
        return
    kind = options.get("kind", "none")
    why = ", whose rotary pairs each read one position axis" if multi_axis else ""
    if train_time:
        raise ConfigError(
            f"+pos.scaling.kind={kind}: a train-time RoPE extension acts on rotary schemes "
            f"(rope, xpos), not on the parent's {scheme.__name__}{why}; extend it without "
            "+pos.scaling"
        )
    asked = [f"eval.rope_scaling.kind={kind}"] if kind != "none" else []
    asked += ["eval.logn_scaling=true"] if options.get("logn") else []
    raise ConfigError(
        f"{' and '.join(asked)}: eval.rope_scaling and eval.logn_scaling act on rotary "
        f"schemes (rope, xpos), not on {scheme.__name__}{why}; set "
        "eval.rope_scaling.kind=none and eval.logn_scaling=false"
    )


def train_scaling_options(given: Any) -> dict[str, Any]:
    """+pos.scaling.* of extend= (a kind, a factor: a number or `auto` = the child's length
    over the parent's, the kind's options, logn), checked as eval.rope_scaling is."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"pos.scaling={given!r} must be a mapping, e.g. +pos.scaling.kind=pi")
    if "train_length" in given:
        raise ConfigError(
            "pos.scaling.train_length is not an option; it is the parent's data.seq_len"
        )
    options = {"kind": "none", "factor": "auto", **given}
    if options["factor"] != "auto":
        require("pos.scaling.factor", options["factor"], _train_factor_check)
    try:
        RopeScaling(**{**options, "factor": 1.0, "train_length": 1})  # every other option
    except TypeError as err:
        raise ConfigError(f"pos.scaling: {err}") from None
    except ConfigError as err:
        # the kinds name their options as eval.rope_scaling.*; here they are +pos.scaling.*
        said = str(err).replace("eval.rope_scaling.", "+pos.scaling.")
        raise ConfigError(said) from None
    check_unread(options, "pos.scaling")
    return options


def check_generation_factor(eval_options: dict[str, Any]) -> None:
    """eval.rope_scaling.factor=auto is L_eval / L_train in eval.py; a generation has no
    evaluation length, and auto at the training length is 1: the kind would change nothing,
    silently. A kind that reads a factor needs a number here."""
    from poslab.positions.extensions import extension_defaults, extension_names

    given = eval_options.get("rope_scaling")
    kind = given.get("kind") if isinstance(given, dict) else None
    if kind not in extension_names():
        return  # none asked, or a kind that is no kind: eval_overrides says which there are
    cls, defaults = extension_defaults(kind)
    factor = given.get("factor", defaults.get("factor", "auto"))
    if cls.uses_factor and not cls.auto_is_one and factor in ("auto", None):
        raise ConfigError(
            f"eval.rope_scaling.kind={kind} needs a number for eval.rope_scaling.factor here "
            "(auto is the evaluated length over the trained one, and a generation has none: "
            "it would be 1 and change nothing); e.g. eval.rope_scaling.factor=4"
        )
