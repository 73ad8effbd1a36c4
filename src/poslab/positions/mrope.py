"""Multimodal rotary position embedding, M-RoPE (Qwen2-VL, Wang et al. 2024).

A token has one position per axis (Qwen2-VL: temporal, height, width), positions `(…, T, A)`.
The R/2 rotary pairs of a head are split into contiguous sections of one frequency spectrum
θ_i = base^(-2i/R), `sections` = [pairs of axis 0, pairs of axis 1, …] (Qwen2-VL: [16, 24, 24]
of 64 pairs), and pair i turns by p_axis(i)·θ_i. The score of two tokens then depends on each
axis only through that axis's difference. Text tokens get equal ids on every axis (the default
positions here), so on text M-RoPE is exactly 1-D RoPE: every angle is the same fp32 product.

`MultiAxisRotary` is the machinery shared with rope2d: each rotary pair has an axis and a
frequency; everything else (pairing, fraction, learnable θ, the fp32 rotation) is Rotary's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.positions.rope import Rotary, rope_theta

QWEN2_VL_SECTIONS = (16, 24, 24)  # of 64 pairs (head_dim 128): t, h, w


class MultiAxisRotary(Rotary):
    """Rotary over positions with `axes` axes: pair i turns by positions[..., axis_of_pair[i]]
    times θ_i. Subclasses choose the axis and the frequency of every pair (`layout`)."""

    eval_scaling = False  # eval.rope_scaling is defined for one position axis
    droppable = False  # DroPE drops a rotary embedding of one position axis

    def __init__(self, d_model: int, n_head: int, axes: int = 2, **options: Any) -> None:
        require("pos.axes", axes, integer(1))
        if options.get("randomize_max") is not None:
            raise ConfigError(
                "pos.randomize_max is not supported by a multi-axis rotary scheme; set it to null"
            )
        if options.get("scaling") is not None:  # only eval.rope_scaling sets pos.scaling
            raise ConfigError(
                "eval.rope_scaling and eval.logn_scaling (pos.scaling) act on 1-D rotary "
                f"schemes (rope, xpos), not on {type(self).__name__}; set "
                "eval.rope_scaling.kind=none and eval.logn_scaling=false"
            )
        super().__init__(d_model, n_head, **options)
        self.position_axes = axes  # the model checks positions against it: (…, T, axes)
        pairs = self.rotary_dims // 2
        if axes > pairs:  # an axis without a rotary pair would be read by nothing
            raise ConfigError(
                f"pos.axes={axes} is more than the {pairs} rotary pairs of a head (head_dim × "
                "pos.fraction / 2), and every axis needs one; lower pos.axes or raise "
                "model.d_model / pos.fraction"
            )
        axis_of_pair, theta = self.layout(pairs, axes)
        self.register_buffer("axis_of_pair", axis_of_pair, persistent=False)
        self.set_theta(theta)

    def layout(self, pairs: int, axes: int) -> tuple[Tensor, Tensor]:
        """(axis of every pair (P,) long, θ of every pair (P,) fp32)."""
        raise NotImplementedError

    def positions(self, batch: int, seq_len: int, device: torch.device) -> Tensor:
        """Text: the same id on every axis (T, axes)."""
        return self.text_positions(torch.arange(seq_len, device=device))

    def text_positions(self, positions: Tensor) -> Tensor:
        return positions[..., None].expand(*positions.shape, self.position_axes)

    def angles(self, positions: Tensor, length: int | None = None) -> Tensor:
        """(…, T, R/2) fp32 angles p_axis(i)·θ_i for fp32 positions (…, T, axes)."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            theta = self.frequencies()
            per_pair = positions[..., self.axis_of_pair]
            if self.position_dtype == "bf16":  # the bug, on purpose: the product in bf16
                bf16 = torch.bfloat16
                return (per_pair.to(bf16) * theta.to(bf16)).float()
            return per_pair * theta

    def check_length(self, max_position: int) -> None:
        """Any position is representable (angles are computed on the fly)."""


def sections_for(pairs: int, axes: int, sections: list[int] | None) -> list[int]:
    """The pairs of each axis: as given (checked), or Qwen2-VL's 2:3:3 for 3 axes scaled to
    `pairs`, or an even split (the remainder to the first axes)."""
    if sections is None:
        if axes == 3 and pairs % 8 == 0:
            return [s * pairs // 64 for s in QWEN2_VL_SECTIONS]
        return [pairs // axes + (a < pairs % axes) for a in range(axes)]
    if isinstance(sections, str) or not isinstance(sections, Sequence):
        raise ConfigError(
            f"pos.sections={sections} must be a list of {axes} integers ≥ 1 (one per axis, "
            f"pos.axes={axes}), or null"
        )
    sections = list(sections)
    if len(sections) != axes or not all(isinstance(s, int) and s >= 1 for s in sections):
        raise ConfigError(
            f"pos.sections={sections} must be {axes} integers ≥ 1 (one per axis, pos.axes={axes})"
        )
    if sum(sections) != pairs:
        raise ConfigError(
            f"pos.sections={sections} add up to {sum(sections)} rotary pairs, but the head has "
            f"{pairs} (head_dim × pos.fraction / 2); make them add up to {pairs}"
        )
    return sections


class MRoPE(MultiAxisRotary):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        axes: int = 3,
        sections: list[int] | None = None,
        **options: Any,
    ) -> None:
        self._sections = sections  # read by layout(), which the base constructor calls
        super().__init__(d_model, n_head, axes=axes, **options)

    def layout(self, pairs: int, axes: int) -> tuple[Tensor, Tensor]:
        self.sections = sections_for(pairs, axes, self._sections)
        axis = torch.repeat_interleave(torch.arange(axes), torch.tensor(self.sections))
        return axis, rope_theta(self.rotary_dims, self.base)
