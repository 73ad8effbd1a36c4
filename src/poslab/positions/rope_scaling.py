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
  λ_i = 2π/θ_i within L; a ramp γ_i (1: kept, 0: interpolated as PI) with α = ``beta_slow``
  (1), β = ``beta_fast`` (32); θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i, and cos/sin are multiplied by
  0.1·ln s + 1, so the rotated part of q·k carries the attention temperature (0.1·ln s + 1)²
  (with ``fraction`` < 1 the unrotated dims are not scaled, as in Hugging Face's port). Two
  ramps (``ramp``):

  - ``paper`` (the default): γ_i = clamp((r_i − α)/(β − α), 0, 1), linear in r_i as in the
    paper and ../shared/ANCHORS.md. It stays the default because every yarn row poslab has
    reported so far was computed with it (a new default would silently change what `yarn`
    means in tables next to older results).
  - ``reference`` (jquesnelle/yarn, Hugging Face's ``_compute_yarn_parameters``): the pair
    index d(r) = R·ln(L/(2π·r))/(2·ln base) at which a frequency turns r times within L gives
    low = ⌊d(β)⌋, high = ⌈d(α)⌉ (``truncate: false``: unrounded, as newer transformers allow;
    true is its default), clamped to [0, R − 1]; γ_i = 1 − clamp((i − low)/(high − low), 0, 1),
    linear over the pair index. It is computed from the scheme's ``pos.base`` and rotated dims
    R, as HF does from rope_theta and dim, also when θ was learned. Inside the ramp the two
    differ a lot (R=64, L=512, s=8: γ 0.32 paper vs 0.69 reference at pair 7).
* ``llama3`` (Llama 3.1; HF ``llama3``): wavelengths λ_i = 2π/θ_i shorter than
  L/``high_freq_factor`` (4) are kept, longer than L/``low_freq_factor`` (1) are divided by s,
  and between θ'_i = (1 − σ_i)·θ_i/s + σ_i·θ_i with σ_i = (L/λ_i − low)/(high − low): YaRN's
  shape with boundaries in turns (low, high) and no temperature. The original context is L.
* ``longrope`` (Ding et al. 2024, LongRoPE; Phi-3's ``longrope`` in HF): searched per-frequency
  factors, θ'_i = θ_i/f_i, with f = ``short_factor`` while the evaluated span is at most L and
  ``long_factor`` beyond it (HF compares max(position) + 1 with original_max_position_embeddings
  = L). Both lists (R/2 numbers each) must be given; [1, 1, …] as short_factor keeps the trained
  frequencies up to L. For s > 1 cos/sin are multiplied by sqrt(1 + ln s/ln L) (HF's default
  attention_factor), at every length, as HF does; with ``factor: auto`` s = 1 up to L.
* ``rerope`` (Su 2023): the relative position min(m − n, w) for a window w: inside the window
  plain rotary; beyond it every key is seen at distance w. The default w = L puts those keys
  one past the largest trained distance (L − 1); bojone/rerope uses w = L/8 … L/4. With
  ``leaky: k`` the distance beyond the window grows as w + (m − n − w)/k. Needs the raw
  scores (attention=blockwise, chosen by attention=auto): two score matrices merged by the
  distance mask, as bojone/rerope does.
* ``selfextend`` (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend"): keys closer than the
  neighbour window w (``window``; null: L/4, datamllab/LongLM's example of 1024 at L = 4096)
  get plain rotary attention; farther keys grouped attention, the query at ⌊m/G⌋ + w − ⌊w/G⌋
  and the key at ⌊n/G⌋ for the group size G (``group``, 4 as in that example), so the largest
  distance at T tokens is about (T − w)/G + w. m and n count from the window's first position
  (the reference indexes the tokens of its input), so ``eval.position_offset`` changes
  nothing. The reference's prefill path writes w − w/G (a float) where the paper and its
  decode path have ⌊w/G⌋; they agree when G divides w. Merged by distance as ReRoPE.
* ``lminfinite`` (Han et al. 2024, LM-Infinite): a Λ-shaped mask, each query sees the first
  ``n_global`` tokens of the window (10: Glaciohound/LM-Infinite's drop-in; its scripts use
  100, "10–100 similar") and the keys closer than ``window`` (null: L), and distances capped
  at L (keys L or more away are seen at distance L: ReRoPE with w = L). Masked scores are
  −inf; the query's own key is always seen, so no row is empty.
* ``logn`` (Su; Qwen's ``use_logn_attn``), combinable with any kind: queries at position m are
  multiplied by max(1, log(m + 1)/log L), keeping the attention entropy of long inputs near the
  trained one. m counts from the window's first position (Qwen indexes the tokens of the
  context), and dynamic NTK's T is the window's span, so ``eval.position_offset`` changes
  neither. L is the training length (``data.seq_len``); for a model trained with randomized
  positions up to N, pass a fixed factor (its angles were trained up to N).

A factor of 1 (and kind ``none``) leaves the computation bit-identical to no scaling for pi,
ntk, yarn and llama3; longrope still applies its short factors (and its long ones past L).
rerope, selfextend and lminfinite ignore the factor: one model serves every length. Options
that are null in conf/eval/default.yaml (ramp, truncate, low/high_freq_factor, group, n_global)
take the defaults above, so configs written before they existed still mean the same.
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

from poslab.checks import boolean, integer, list_of, number, require
from poslab.errors import ConfigError
from poslab.instantiate import scheme_options

KINDS = (
    "none",
    "pi",
    "ntk",
    "dynamic_ntk",
    "yarn",
    "rerope",
    "llama3",
    "longrope",
    "selfextend",
    "lminfinite",
)
# kinds that merge two score matrices by distance (and mask): they need the raw scores
SCORE_KINDS = ("rerope", "selfextend", "lminfinite")
# kinds that ignore the factor: one model serves every evaluation length
FACTORLESS = ("none", *SCORE_KINDS)
RAMPS = ("paper", "reference")
# options that are null in conf/eval/default.yaml (so that runs made before they existed keep
# their configuration) and null here too: the kind's default
NULL_IS_DEFAULT = ("ramp", "truncate", "low_freq_factor", "high_freq_factor", "group", "n_global")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    factor: float = 1.0  # s
    train_length: int = 0  # L: the length the model was trained at
    beta_fast: float = 32.0  # YaRN β: frequencies turning more often than this are kept
    beta_slow: float = 1.0  # YaRN α: frequencies turning less often than this are interpolated
    window: int | None = (
        None  # ReRoPE w (null: L), Self-Extend's neighbours (L/4), LM-Infinite's (L)
    )
    leaky: float | None = None  # ReRoPE: beyond w the distance grows by 1/leaky per token
    logn: bool = False
    ramp: str = "paper"  # YaRN: paper (linear in turns) | reference (linear in pair index)
    truncate: bool = True  # YaRN reference ramp: boundary pairs rounded outwards (HF's default)
    low_freq_factor: float = 1.0  # llama3: wavelengths beyond L/low are interpolated
    high_freq_factor: float = 4.0  # llama3: wavelengths below L/high are kept
    long_factor: tuple[float, ...] | None = None  # longrope: θ_i/f_i past L (R/2 numbers)
    short_factor: tuple[float, ...] | None = None  # longrope: θ_i/f_i up to L (R/2 numbers)
    group: int = 4  # Self-Extend G: grouped positions ⌊m/G⌋
    n_global: int = 10  # LM-Infinite: the first tokens every query sees

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"eval.rope_scaling.kind={self.kind!r}; choose one of {KINDS}")
        for name in NULL_IS_DEFAULT:
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.__dataclass_fields__[name].default)
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
        require("eval.rope_scaling.ramp", self.ramp, _choice(RAMPS))
        require("eval.rope_scaling.truncate", self.truncate, boolean())
        require("eval.rope_scaling.low_freq_factor", self.low_freq_factor, number(gt=0))
        require("eval.rope_scaling.high_freq_factor", self.high_freq_factor, number(gt=0))
        if self.kind == "llama3" and self.low_freq_factor >= self.high_freq_factor:
            raise ConfigError(
                f"eval.rope_scaling.low_freq_factor={self.low_freq_factor:g} must be below "
                f"high_freq_factor={self.high_freq_factor:g} (Llama 3.1: 1 and 4)"
            )
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            require(f"eval.rope_scaling.{name}", value, list_of(number(gt=0), null=True))
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        if self.kind == "longrope" and (self.long_factor is None or self.short_factor is None):
            missing = [n for n in ("long_factor", "short_factor") if getattr(self, n) is None]
            raise ConfigError(
                f"eval.rope_scaling.kind=longrope needs its per-frequency factors: set "
                f"eval.rope_scaling.{' and '.join(missing)}=[...] (R/2 numbers each, θ_i "
                "divided by the i-th; short_factor=[1,1,...] keeps the trained frequencies up to L)"
            )
        require("eval.rope_scaling.group", self.group, integer(1))
        require("eval.rope_scaling.n_global", self.n_global, integer(0))

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

    def check_dims(self, rotary_dims: int) -> None:
        """What needs the model's rotated dims R: longrope's lists hold R/2 numbers."""
        if self.kind != "longrope":
            return
        for name in ("long_factor", "short_factor"):
            given = len(getattr(self, name))
            if given != rotary_dims // 2:
                raise ConfigError(
                    f"eval.rope_scaling.{name} has {given} numbers, but this model rotates "
                    f"R = {rotary_dims} dims per head: give R/2 = {rotary_dims // 2} (one per "
                    "frequency, the fastest first)"
                )

    def is_identity(self) -> bool:
        """Whether it computes exactly what no scaling does (a factor of 1 for pi, ntk, yarn,
        llama3)."""
        unscaled = self.kind == "none" or (
            self.kind in ("pi", "ntk", "yarn", "llama3") and self.factor == 1
        )
        return unscaled and not self.logn

    @property
    def rescales_theta(self) -> bool:
        """Whether the frequencies change (a factor of 1 changes nothing, bit for bit)."""
        return (
            self.kind in ("ntk", "yarn", "llama3")
            and self.factor != 1
            or self.kind in ("dynamic_ntk", "longrope")
        )

    @property
    def needs_scores(self) -> bool:
        """Whether it merges two score matrices by distance (rerope, selfextend, lminfinite)."""
        return self.kind in SCORE_KINDS

    # -- what each kind changes ----------------------------------------------------------------

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        """The frequencies θ'_i (fp32) for a forward over `length` positions. `base` (the
        scheme's pos.base) places YaRN's reference ramp; without it, it is read off θ as
        (θ_0/θ_1)^(R/2), which holds for an untrained θ."""
        if not self.rescales_theta:
            return theta
        if self.kind in ("ntk", "dynamic_ntk"):
            return self._ntk_theta(theta, rotary_dims, length)
        if self.kind == "llama3":
            return self._llama3_theta(theta)
        if self.kind == "longrope":
            factors = self.long_factor if length > self.train_length else self.short_factor
            return theta / torch.tensor(factors, dtype=theta.dtype, device=theta.device)
        ramp = self.yarn_ramp(theta, rotary_dims, base)  # yarn
        return (1 - ramp) * theta / self.factor + ramp * theta

    def _ntk_theta(self, theta: Tensor, rotary_dims: int, length: int) -> Tensor:
        if rotary_dims <= 2:
            raise ConfigError(
                f"eval.rope_scaling.kind={self.kind} changes the base by R/(R − 2), undefined for "
                f"R = {rotary_dims} rotated dims; rotate more dims (pos.fraction) or use pi"
            )
        i = torch.arange(theta.shape[-1], dtype=torch.float32, device=theta.device)
        exponent = -2 * i / rotary_dims  # base·α gives θ_i·α^(−2i/R), for any trained θ
        if self.kind == "ntk":
            alpha = self.factor ** (rotary_dims / (rotary_dims - 2))
            return theta * alpha**exponent
        if length <= self.train_length:  # dynamic_ntk
            return theta
        s = self.factor
        alpha = (s * length / self.train_length - (s - 1)) ** (rotary_dims / (rotary_dims - 2))
        return theta * alpha**exponent

    def _llama3_theta(self, theta: Tensor) -> Tensor:
        """Llama 3.1: kept below L/high_freq_factor, θ/s above L/low_freq_factor, smooth between."""
        length, low, high, s = (
            self.train_length,
            self.low_freq_factor,
            self.high_freq_factor,
            self.factor,
        )
        wavelength = 2 * math.pi / theta
        smooth = (length / wavelength - low) / (high - low)
        between = (1 - smooth) * theta / s + smooth * theta
        scaled = torch.where(wavelength > length / low, theta / s, between)
        return torch.where(wavelength < length / high, theta, scaled)

    def yarn_ramp(
        self, theta: Tensor, rotary_dims: int | None = None, base: float | None = None
    ) -> Tensor:
        """γ_i: 1 where frequency i is kept, 0 where it is interpolated as PI; `ramp: paper`:
        1 where it turns more than β times within L, 0 below α, linear in r_i between;
        `ramp: reference`: linear over the pair index between the correction pairs."""
        if self.ramp == "reference":
            return self._reference_ramp(theta, rotary_dims or 2 * theta.shape[-1], base)
        turns = self.train_length * theta / (2 * math.pi)  # r_i = L / λ_i
        ramp = (turns - self.beta_slow) / (self.beta_fast - self.beta_slow)
        return ramp.clamp(0.0, 1.0)

    def _reference_ramp(self, theta: Tensor, rotary_dims: int, base: float | None) -> Tensor:
        """jquesnelle/yarn's `_yarn_find_correction_range` and `_yarn_linear_ramp_mask`, as HF's
        `_compute_yarn_parameters`: γ = HF's inv_freq_extrapolation_factor."""
        if base is None:
            if theta.shape[-1] < 2:
                raise ConfigError(
                    "eval.rope_scaling.ramp=reference places its ramp by pos.base, which one "
                    "rotated pair cannot tell; rotate more dims (pos.fraction) or use ramp=paper"
                )
            base = float(theta[0] / theta[1]) ** (rotary_dims / 2)

        def pair(turns: float) -> float:  # the pair index turning `turns` times within L
            return (
                rotary_dims
                * math.log(self.train_length / (turns * 2 * math.pi))
                / (2 * math.log(base))
            )

        low, high = pair(self.beta_fast), pair(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dims - 1)
        if low == high:
            high += 0.001  # as the reference: no division by zero
        i = torch.arange(theta.shape[-1], dtype=torch.float32, device=theta.device)
        return 1 - ((i - low) / (high - low)).clamp(0.0, 1.0)

    @property
    def position_scale(self) -> float:
        """PI: positions are divided by s."""
        return 1.0 / self.factor if self.kind == "pi" and self.factor != 1 else 1.0

    @property
    def attention_factor(self) -> float:
        """cos and sin (so q and k each) times this: YaRN 0.1·ln s + 1; LongRoPE
        sqrt(1 + ln s/ln L) for s > 1."""
        if self.kind == "yarn":
            return 0.1 * math.log(self.factor) + 1.0
        if self.kind == "longrope" and self.factor > 1 and self.train_length > 1:
            return math.sqrt(1 + math.log(self.factor) / math.log(self.train_length))
        return 1.0

    def query_scale(self, positions: Tensor) -> Tensor | None:
        """log-n: max(1, log(m + 1)/log L) per query (fp32), m counted from the first position
        of the window (…, T), or None."""
        if not self.logn:
            return None
        m = positions - positions.min(dim=-1, keepdim=True).values
        return (torch.log(m + 1) / math.log(self.train_length)).clamp(min=1.0)

    def local_window(self) -> int:
        """The window of plain rotary attention of a score kind: ReRoPE's w (L), Self-Extend's
        neighbour window (L/4), LM-Infinite's local branch (L)."""
        if self.window:
            return self.window
        if self.kind == "selfextend":
            return max(1, self.train_length // 4)
        return self.train_length

    def label(self, factor: str | None = None) -> str:
        """A short name for tables, `yarn s=4 +logn`; `factor` shows it as given (`auto`)."""
        shown = factor or f"{self.factor:g}"
        parts = [] if self.kind == "none" else [self.kind]
        if self.kind in ("pi", "ntk", "yarn", "llama3", "longrope") or (
            self.kind == "dynamic_ntk" and shown not in ("1", "auto")
        ):
            parts.append(f"s={shown}")
        if self.kind == "yarn" and self.ramp == "reference":
            parts.append("ramp=ref" if self.truncate else "ramp=ref,untruncated")
        if self.kind == "llama3" and (self.low_freq_factor, self.high_freq_factor) != (1, 4):
            parts.append(f"lf={self.low_freq_factor:g} hf={self.high_freq_factor:g}")
        if self.kind == "rerope":
            parts.append(f"w={self.window}" if self.window else "w=L")
            if self.leaky:
                parts.append(f"k={self.leaky:g}")
        if self.kind == "selfextend":
            parts.append(f"G={self.group}")
            parts.append(f"w={self.window}" if self.window else "w=L/4")
        if self.kind == "lminfinite":
            parts.append(f"g={self.n_global}")
            parts.append(f"w={self.window}" if self.window else "w=L")
        if self.logn:
            parts.append("+logn" if parts else "logn")
        return " ".join(parts)


def resolve_factor(kind: str, factor: Any, eval_length: int, train_length: int) -> float:
    """eval.rope_scaling.factor for one evaluation length: `auto` is L_eval / L_train (at least
    1), except for dynamic_ntk, which reads the length itself (s = 1); none, rerope, selfextend
    and lminfinite ignore the factor (1: one model serves every length)."""
    if kind in FACTORLESS:
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


def _choice(options: tuple[str, ...]) -> Any:
    def check(value: Any) -> str | None:
        return None if value in options else f"must be one of {', '.join(options)}"

    return check


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
    (left out where it is the identity: a factor of 1 for pi, ntk, yarn and llama3)."""

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
