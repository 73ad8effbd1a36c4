"""2-D rotary position embedding for images (one position per axis: row, column).

Two layouts of the rotary pairs over the axes (`axis_layout`):

* ``split`` (axial RoPE, as in Llama 4's vision encoder): the first half of the pairs turn with
  the row, the second half with the column, each half with its own full spectrum
  base^(-2j/(R/2)), so both axes get high and low frequencies;
* ``interleaved`` (Pixtral): one spectrum θ_i = base^(-2i/R), even pairs turn with the row, odd
  pairs with the column.

Either way the score depends on each axis only through that axis's difference. Compare M-RoPE
(mrope.py): contiguous sections of one spectrum, so one axis gets only the high frequencies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from poslab.errors import ConfigError
from poslab.positions.mrope import MultiAxisRotary
from poslab.positions.rope import rope_theta

AXIS_LAYOUTS = ("split", "interleaved")


class Rotary2D(MultiAxisRotary):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        axis_layout: str = "split",
        axes: int = 2,
        **options: Any,
    ) -> None:
        if axis_layout not in AXIS_LAYOUTS:
            raise ConfigError(
                f"pos.axis_layout={axis_layout!r}; choose one of {', '.join(AXIS_LAYOUTS)}"
            )
        self.axis_layout = axis_layout
        super().__init__(d_model, n_head, axes=axes, **options)

    def layout(self, pairs: int, axes: int) -> tuple[Tensor, Tensor]:
        if self.axis_layout == "interleaved":
            return torch.arange(pairs) % axes, rope_theta(self.rotary_dims, self.base)
        if pairs % axes:
            raise ConfigError(
                f"pos.axis_layout=split gives each of the {axes} axes the same number of rotary "
                f"pairs, but the head has {pairs}; use axis_layout=interleaved or a head size "
                "divisible accordingly"
            )
        each = pairs // axes
        axis = torch.arange(axes).repeat_interleave(each)
        return axis, rope_theta(2 * each, self.base).repeat(axes)
