"""`longrope` (Ding et al. 2024; Phi-3's `longrope` in HF): searched per-frequency factors,
θ'_i = θ_i/f_i, with f = `short_factor` while the evaluated span is at most L and `long_factor`
beyond it. Both lists (R/2 numbers each) must be given. For s > 1 cos/sin are multiplied by
sqrt(1 + ln s/ln L) (HF's default attention_factor), at every length; with `factor: auto`
s = 1 up to L."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import list_of, number, require
from poslab.errors import ConfigError
from poslab.positions.extensions.base import Extension

LISTS = ("long_factor", "short_factor")


@dataclass(frozen=True)
class LongRoPE(Extension):
    long_factor: tuple[float, ...] | None = None  # θ_i/f_i past L (R/2 numbers)
    short_factor: tuple[float, ...] | None = None  # θ_i/f_i up to L (R/2 numbers)

    reads_length: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        for name in LISTS:
            value = getattr(self, name)
            require(f"eval.rope_scaling.{name}", value, list_of(number(gt=0), null=True))
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        missing = [n for n in LISTS if getattr(self, n) is None]
        if missing:
            raise ConfigError(
                f"eval.rope_scaling.kind=longrope needs its per-frequency factors: set "
                f"eval.rope_scaling.{' and '.join(missing)}=[...] (R/2 numbers each, θ_i "
                "divided by the i-th; short_factor=[1,1,...] keeps the trained frequencies up to L)"
            )

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        factors = self.long_factor if length > self.train_length else self.short_factor
        return theta / torch.tensor(factors, dtype=theta.dtype, device=theta.device)

    @property
    def attention_factor(self) -> float:
        if self.factor > 1 and self.train_length > 1:
            return math.sqrt(1 + math.log(self.factor) / math.log(self.train_length))
        return 1.0

    def check_dims(self, rotary_dims: int) -> None:
        for name in LISTS:
            given = len(getattr(self, name))
            if given != rotary_dims // 2:
                raise ConfigError(
                    f"eval.rope_scaling.{name} has {given} numbers, but this model rotates "
                    f"R = {rotary_dims} dims per head: give R/2 = {rotary_dims // 2} (one per "
                    "frequency, the fastest first)"
                )
