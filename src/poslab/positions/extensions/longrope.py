"""`longrope` (Ding et al. 2024; Phi-3's `longrope` in HF): searched per-frequency factors,
θ'_i = θ_i/f_i, with f = `short_factor` while the evaluated span is at most L and `long_factor`
beyond it. Both lists (R/2 numbers each) must be given, or `factors_file`: a JSON file holding
both (`long_factor`, `short_factor`; scripts/longrope_search.py writes one, searched for a run),
read when the kind is built; the model's config then records the lists, not the path
(`resolved_options`). For s > 1 cos/sin are multiplied by sqrt(1 + ln s/ln L) (HF's default
attention_factor), at every length; with `factor: auto` s = 1 up to L."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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
    factors_file: str | None = None  # a JSON file with both lists, instead of them

    reads_length: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def check(self) -> None:
        if self.factors_file is not None:
            self._read_factors_file()
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
                ", or eval.rope_scaling.factors_file=PATH (scripts/longrope_search.py writes one)"
            )

    def _read_factors_file(self) -> None:
        """Both lists from `factors_file` (the path is then dropped: the lists are the option,
        so a model rebuilt from this kind's options needs no file)."""
        path = str(self.factors_file)
        given = [n for n in LISTS if getattr(self, n) is not None]
        if given:
            raise ConfigError(
                f"eval.rope_scaling.factors_file and eval.rope_scaling.{given[0]} both give "
                "longrope's factors; pass the file or the two lists, not both"
            )
        lists = read_factors_file(path)
        for name in LISTS:
            object.__setattr__(self, name, lists[name])
        object.__setattr__(self, "factors_file", None)
        object.__setattr__(self, "_read_from", path)

    def resolved_options(self) -> dict[str, Any]:
        if getattr(self, "_read_from", None) is None:
            return {}
        return {"factors_file": None, **{n: list(getattr(self, n)) for n in LISTS}}

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


def read_factors_file(path: str | Path) -> dict[str, Any]:
    """`long_factor` and `short_factor` of a JSON file (scripts/longrope_search.py's
    longrope_factors.json), unchecked; a file that cannot be read or holds no such lists is
    one line naming the option."""
    key = f"eval.rope_scaling.factors_file={path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(
            f"{key}: cannot read it ({err.strerror or err}); pass the longrope_factors.json "
            "that scripts/longrope_search.py wrote"
        ) from None
    except ValueError as err:  # not JSON, not UTF-8
        raise ConfigError(f"{key} is not a JSON file ({str(err).splitlines()[0]})") from None
    missing = [n for n in LISTS if not isinstance(data, dict) or n not in data]
    if missing:
        raise ConfigError(
            f"{key} has no {' and no '.join(missing)}; pass a JSON object with both lists "
            "(scripts/longrope_search.py writes one)"
        )
    return {name: data[name] for name in LISTS}
