"""`yarn` (Peng et al. 2023): per frequency, r_i = L/λ_i turns of the wavelength λ_i = 2π/θ_i
within L; a ramp γ_i (1: kept, 0: interpolated as PI) with α = `beta_slow` (1), β = `beta_fast`
(32); θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i, and cos/sin are multiplied by 0.1·ln s + 1, so the
rotated part of q·k carries the attention temperature (0.1·ln s + 1)². Two ramps (`ramp`):

- `paper` (the default): γ_i = clamp((r_i − α)/(β − α), 0, 1), linear in r_i as in the paper.
  Every yarn row poslab has reported so far was computed with it.
- `reference` (jquesnelle/yarn, Hugging Face's `_compute_yarn_parameters`): the pair index
  d(r) = R·ln(L/(2π·r))/(2·ln base) at which a frequency turns r times within L gives
  low = ⌊d(β)⌋, high = ⌈d(α)⌉ (`truncate: false`: unrounded), clamped to [0, R − 1];
  γ_i = 1 − clamp((i − low)/(high − low), 0, 1), linear over the pair index, computed from the
  scheme's `pos.base` and rotated dims R, as HF does from rope_theta and dim."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.checks import boolean, number, require
from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension

RAMPS = ("paper", "reference")


@dataclass(frozen=True)
class YaRN(Extension):
    beta_fast: float = 32.0  # β: frequencies turning more often than this within L are kept
    beta_slow: float = 1.0  # α: frequencies turning less often than this are interpolated
    ramp: str = "paper"  # paper (linear in turns) | reference (linear in pair index)
    truncate: bool = True  # reference ramp: boundary pairs rounded outwards (HF's default)

    def check(self) -> None:
        require("eval.rope_scaling.beta_fast", self.beta_fast, number(gt=0))
        require("eval.rope_scaling.beta_slow", self.beta_slow, number(gt=0))
        if self.beta_slow >= self.beta_fast:
            raise ConfigError(
                f"eval.rope_scaling.beta_slow={self.beta_slow} must be below beta_fast="
                f"{self.beta_fast} (YaRN: α = beta_slow = 1, β = beta_fast = 32)"
            )
        if self.ramp not in RAMPS:
            raise ConfigError(
                f"eval.rope_scaling.ramp={self.ramp} must be one of {', '.join(RAMPS)}"
            )
        require("eval.rope_scaling.truncate", self.truncate, boolean())

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        ramp = self.yarn_ramp(theta, rotary_dims, base)
        return (1 - ramp) * theta / self.factor + ramp * theta

    @property
    def attention_factor(self) -> float:
        return 0.1 * math.log(self.factor) + 1.0

    def yarn_ramp(
        self, theta: Tensor, rotary_dims: int | None = None, base: float | None = None
    ) -> Tensor:
        """γ_i: 1 where frequency i is kept, 0 where it is interpolated as PI."""
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

    def label_parts(self, shown_factor: str) -> list[str]:
        parts = [f"s={shown_factor}"]
        if self.ramp == "reference":
            parts.append("ramp=ref" if self.truncate else "ramp=ref,untruncated")
        return parts
