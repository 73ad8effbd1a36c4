"""Positional schemes, one module each, all behind `PositionalScheme` (base.py)."""

from poslab.positions.alibi import ALiBi, alibi_slopes
from poslab.positions.base import PositionalScheme
from poslab.positions.learned import LearnedPositions
from poslab.positions.nope import NoPositions
from poslab.positions.rope import Rotary
from poslab.positions.sinusoidal import SinusoidalPositions
from poslab.positions.t5 import T5Bias

__all__ = [
    "ALiBi",
    "LearnedPositions",
    "NoPositions",
    "PositionalScheme",
    "Rotary",
    "SinusoidalPositions",
    "T5Bias",
    "alibi_slopes",
]
