"""Eval-time RoPE context extension: read past the training length L without retraining.

s is the scaling factor (L_eval / L_train, or fixed), R the rotated dims, θ_i = base^(−2i/R).

* ``pi`` (Position Interpolation, Chen et al. 2023): positions m → m/s, so every angle stays
  inside the range seen in training.
* ``ntk`` (NTK-aware, bloc97 2023): base → base·s^(R/(R−2)), i.e. θ_i → θ_i·s^(−2i/(R−2)): the
  highest frequency is kept, the lowest is interpolated by exactly s.
* ``dynamic_ntk``: the NTK base recomputed from the length T of each forward (Hugging Face's
  ``_compute_dynamic_ntk_parameters``): base·((s·T/L) − (s − 1))^(R/(R−2)) for T > L, else
  base. The length is already read from the input, so ``factor: auto`` means s = 1 here, which
  is NTK with s = T/L.
* ``yarn`` (Peng et al. 2023): per frequency, r_i = L/λ_i turns of the wavelength
  λ_i = 2π/θ_i within L; ramp γ_i = clamp((r_i − α)/(β − α), 0, 1), α = ``beta_slow`` (1),
  β = ``beta_fast`` (32); θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i (frequencies that turn more than β
  times are kept, fewer than α are interpolated as PI), and cos/sin are multiplied by
  0.1·ln s + 1, so the rotated part of q·k carries the attention temperature (0.1·ln s + 1)²
  (with ``fraction`` < 1 the unrotated dims are not scaled, as in Hugging Face's port). The ramp
  is linear in r_i as in the paper and ../shared/ANCHORS.md; the reference code
  (jquesnelle/yarn) ramps linearly over the pair index between the rounded boundary pairs,
  which inside the ramp differs a lot (R=64, L=512, s=8: γ 0.32 here vs 0.69 there at pair 5),
  so rows labelled yarn are the paper's formula, not a bit-for-bit copy of the reference.
* ``rerope`` (Su 2023): the relative position min(m − n, w) for a window w: inside the window
  plain rotary; beyond it every key is seen at distance w. The default w = L puts those keys
  one past the largest trained distance (L − 1); bojone/rerope uses w = L/8 … L/4. With
  ``leaky: k`` the distance beyond the window grows as w + (m − n − w)/k. Needs the raw
  scores (attention=blockwise, chosen by attention=auto): two score matrices merged by the
  distance mask, as bojone/rerope does.
* ``logn`` (Su; Qwen's ``use_logn_attn``), combinable with any kind: queries at position m are
  multiplied by max(1, log(m + 1)/log L), keeping the attention entropy of long inputs near the
  trained one. m counts from the window's first position (Qwen indexes the tokens of the
  context), and dynamic NTK's T is the window's span, so ``eval.position_offset`` changes
  neither. L is the training length (``data.seq_len``); for a model trained with randomized
  positions up to N, pass a fixed factor (its angles were trained up to N).

A factor of 1 (and kind ``none``) leaves the computation bit-identical to no scaling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from poslab.checks import boolean, integer, number, require
from poslab.errors import ConfigError
from poslab.instantiate import scheme_options

KINDS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "rerope")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    factor: float = 1.0  # s
    train_length: int = 0  # L: the length the model was trained at
    beta_fast: float = 32.0  # YaRN β: frequencies turning more often than this are kept
    beta_slow: float = 1.0  # YaRN α: frequencies turning less often than this are interpolated
    window: int | None = None  # ReRoPE w (null: the training length)
    leaky: float | None = None  # ReRoPE: beyond w the distance grows by 1/leaky per token
    logn: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"eval.rope_scaling.kind={self.kind!r}; choose one of {KINDS}")
        require("eval.rope_scaling.factor", self.factor, number(ge=1))
        require("eval.rope_scaling.train_length", self.train_length, integer(1))
        require("eval.rope_scaling.beta_fast", self.beta_fast, number(gt=0))
        require("eval.rope_scaling.beta_slow", self.beta_slow, number(gt=0))
        if self.kind == "yarn" and self.beta_slow >= self.beta_fast:
            raise ConfigError(
                f"eval.rope_scaling.beta_slow={self.beta_slow} must be below beta_fast="
                f"{self.beta_fast} (YaRN: α = beta_slow = 1, β = beta_fast = 32)"
            )
        require("eval.rope_scaling.window", self.window, integer(1, null=True))
        require("eval.rope_scaling.leaky", self.leaky, number(gt=1, null=True))
        require("eval.rope_scaling.logn", self.logn, boolean())

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> RopeScaling | None:
        """The scaling of a scheme option (a mapping; None or kind none without logn: none)."""
        if not options:
            return None
        if not isinstance(options, Mapping):
            raise ConfigError(f"pos.scaling={options!r} must be a mapping of scaling options")
        options = dict(options)
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"eval.rope_scaling has no option {sorted(unknown)[0]!r} (it has: "
                f"{', '.join(cls.__dataclass_fields__)})"
            )
        scaling = cls(**options)
        return None if scaling.is_identity() else scaling

    def options(self) -> dict[str, Any]:
        return asdict(self)

    def is_identity(self) -> bool:
        """Whether it computes exactly what no scaling does (a factor of 1 for pi, ntk, yarn)."""
        unscaled = self.kind == "none" or self.kind in ("pi", "ntk", "yarn") and self.factor == 1
        return unscaled and not self.logn

    @property
    def rescales_theta(self) -> bool:
        """Whether the frequencies change (a factor of 1 changes nothing, bit for bit)."""
        return self.kind in ("ntk", "yarn") and self.factor != 1 or self.kind == "dynamic_ntk"

    # -- what each kind changes ----------------------------------------------------------------

    def theta(self, theta: Tensor, rotary_dims: int, length: int) -> Tensor:
        """The frequencies θ'_i (fp32) for a forward over `length` positions."""
        if not self.rescales_theta:
            return theta
        i = torch.arange(theta.shape[-1], dtype=torch.float32, device=theta.device)
        exponent = -2 * i / rotary_dims  # base·α gives θ_i·α^(−2i/R), for any trained θ
        if rotary_dims <= 2:
            raise ConfigError(
                f"eval.rope_scaling.kind={self.kind} changes the base by R/(R − 2), undefined for "
                f"R = {rotary_dims} rotated dims; rotate more dims (pos.fraction) or use pi"
            )
        if self.kind == "ntk":
            alpha = self.factor ** (rotary_dims / (rotary_dims - 2))
            return theta * alpha**exponent
        if self.kind == "dynamic_ntk":
            if length <= self.train_length:
                return theta
            s = self.factor
            alpha = (s * length / self.train_length - (s - 1)) ** (rotary_dims / (rotary_dims - 2))
            return theta * alpha**exponent
        ramp = self.yarn_ramp(theta)  # yarn
        return (1 - ramp) * theta / self.factor + ramp * theta

    def yarn_ramp(self, theta: Tensor) -> Tensor:
        """γ_i: 1 where frequency i turns more than β times within L (kept), 0 below α
        (interpolated), linear in r_i between."""
        turns = self.train_length * theta / (2 * math.pi)  # r_i = L / λ_i
        ramp = (turns - self.beta_slow) / (self.beta_fast - self.beta_slow)
        return ramp.clamp(0.0, 1.0)

    @property
    def position_scale(self) -> float:
        """PI: positions are divided by s."""
        return 1.0 / self.factor if self.kind == "pi" and self.factor != 1 else 1.0

    @property
    def attention_factor(self) -> float:
        """YaRN: cos and sin (so q and k each) times 0.1·ln s + 1."""
        return 0.1 * math.log(self.factor) + 1.0 if self.kind == "yarn" else 1.0

    def query_scale(self, positions: Tensor) -> Tensor | None:
        """log-n: max(1, log(m + 1)/log L) per query (fp32), m counted from the first position
        of the window (…, T), or None."""
        if not self.logn:
            return None
        m = positions - positions.min(dim=-1, keepdim=True).values
        return (torch.log(m + 1) / math.log(self.train_length)).clamp(min=1.0)

    def rerope_window(self) -> int:
        return self.window or self.train_length

    def label(self, factor: str | None = None) -> str:
        """A short name for tables, `yarn s=4 +logn`; `factor` shows it as given (`auto`)."""
        shown = factor or f"{self.factor:g}"
        parts = [] if self.kind == "none" else [self.kind]
        if self.kind in ("pi", "ntk", "yarn") or (
            self.kind == "dynamic_ntk" and shown not in ("1", "auto")
        ):
            parts.append(f"s={shown}")
        if self.kind == "rerope":
            parts.append(f"w={self.window}" if self.window else "w=L")
            if self.leaky:
                parts.append(f"k={self.leaky:g}")
        if self.logn:
            parts.append("+logn" if parts else "logn")
        return " ".join(parts)


def resolve_factor(kind: str, factor: Any, eval_length: int, train_length: int) -> float:
    """eval.rope_scaling.factor for one evaluation length: `auto` is L_eval / L_train (at least
    1), except for dynamic_ntk, which reads the length itself (s = 1); none and rerope ignore
    the factor (1: one model serves every length)."""
    if kind in ("none", "rerope"):
        return 1.0
    if factor == "auto":
        if kind == "dynamic_ntk":
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
    return None if options.get("kind", "none") == "none" and not logn else options


def _plain(cfg: Any) -> Any:

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def _factor_check(value: Any) -> str | None:

    problem = number(ge=1)(value)
    return None if problem is None else f"{problem} or auto (= eval length / training length)"


def eval_variant_label(eval_cfg: Any) -> str:
    """A short name of the eval-time variant for tables (`yarn s=auto +logn`), or ''."""
    options = eval_variant_options(eval_cfg)
    if options is None:
        return ""

    factor = options.get("factor", "auto")
    shown = "auto" if factor == "auto" else f"{float(factor):g}"
    return RopeScaling(**{**options, "factor": 1.0, "train_length": 1}).label(shown)


def eval_overrides(
    eval_cfg: Any, pos_cfg: dict[str, Any], length: int, train_length: int
) -> dict[str, Any]:
    """The scheme options an evaluation at `length` changes: eval.pos_overrides, plus the
    `scaling` option of the eval-time RoPE context extension with its factor for this length
    (left out where it is the identity: a factor of 1 for pi, ntk and yarn)."""

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
    kind, factor = options.get("kind", "none"), options.get("factor", "auto")
    factor = resolve_factor(kind, factor, length, train_length)
    scaling = {**options, "factor": factor, "train_length": train_length}
    if not RopeScaling(**scaling).is_identity():  # the identity: the trained model itself
        overrides["scaling"] = scaling
    return overrides
