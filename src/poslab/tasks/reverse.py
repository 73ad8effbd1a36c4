"""Reverse a random string (Ruoss et al. 2023): as `copy`, with the output reversed.

<bos> c a f f b = b f f a c
"""

from __future__ import annotations

import numpy as np

from poslab.tasks.copy import Copy


class Reverse(Copy):
    name = "reverse"

    def output(self, string_ids: np.ndarray) -> np.ndarray:
        return string_ids[::-1]
