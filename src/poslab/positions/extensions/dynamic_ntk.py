"""`dynamic_ntk`: the NTK base recomputed from the length T of each forward (Hugging Face's
`_compute_dynamic_ntk_parameters`): base·((s·T/L) − (s − 1))^(R/(R−2)) for T > L, else base.
The length is read from the input, so `factor: auto` means s = 1 here, which is NTK with
s = T/L."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from poslab.positions.extensions.base import Extension
from poslab.positions.extensions.ntk import ntk_theta


class DynamicNTK(Extension):
    auto_is_one: ClassVar[bool] = True
    reads_length: ClassVar[bool] = True
    identity_at_one: ClassVar[bool] = False

    def theta(
        self, theta: Tensor, rotary_dims: int, length: int, base: float | None = None
    ) -> Tensor:
        if rotary_dims > 2 and length <= self.train_length:
            return theta
        s = self.factor
        scale = s * length / self.train_length - (s - 1)
        if length <= self.train_length:
            scale = 1.0  # R ≤ 2: refused below, as for any length
        return ntk_theta(theta, rotary_dims, scale, "dynamic_ntk")

    def label_parts(self, shown_factor: str) -> list[str]:
        return [] if shown_factor in ("1", "auto") else [f"s={shown_factor}"]
