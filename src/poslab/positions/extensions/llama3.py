"""`llama3` (Llama 3.1; HF `llama3`): wavelengths λ_i = 2π/θ_i shorter than L/`high_freq_factor`
(4) are kept, longer than L/`low_freq_factor` (1) are divided by s, and between
θ'_i = (1 − σ_i)·θ_i/s + σ_i·θ_i with σ_i = (L/λ_i − low)/(high − low): YaRN's shape with
boundaries in turns and no temperature. The original context is L."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.checks import number, require
from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension


@dataclass(frozen=True)
class Llama3(Extension):
    low_freq_factor: float = 1.0  # wavelengths beyond L/low are interpolated
    high_freq_factor: float = 4.0  # wavelengths below L/high are kept

    def check(self) -> None:
        require("eval.rope_scaling.low_freq_factor", self.low_freq_factor, number(gt=0))
        require("eval.rope_scaling.high_freq_factor", self.high_freq_factor, number(gt=0))
        if self.low_freq_factor >= self.high_freq_factor:
            raise ConfigError(
                f"eval.rope_scaling.low_freq_factor={self.low_freq_factor:g} must be below "
                f"high_freq_factor={self.high_freq_factor:g} (Llama 3.1: 1 and 4)"
            )

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
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

    def label_parts(self, shown_factor: str) -> list[str]:
        parts = [f"s={shown_factor}"]
        if (self.low_freq_factor, self.high_freq_factor) != (1, 4):
            parts.append(f"lf={self.low_freq_factor:g} hf={self.high_freq_factor:g}")
        return parts
