"""`pi`, Position Interpolation (Chen et al. 2023): positions m → m/s, so every angle stays inside
the range seen in training."""

from __future__ import annotations

from poslab.positions.extensions.base import Extension


class PositionInterpolation(Extension):
    @property
    def position_scale(self) -> float:
        return 1.0 / self.factor if self.factor != 1 else 1.0
