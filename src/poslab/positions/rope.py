"""Rotary position embedding (RoFormer, Su et al. 2021).

Each pair of rotated dims (x_a, x_b) of a query or key at position m turns by the angle m·θ_i,
θ_i = base^(-2i/R) for the R rotated dims of a head. The q·k score of two rotated vectors then
depends on their positions only through m - n. Two pairings are offered; they are equivalent up to
a fixed permutation of the weights:

* ``interleaved`` (RoFormer): dims 2i and 2i+1 rotate together;
* ``half`` (GPT-NeoX / LLaMA "rotate half"): dims i and i + R/2 rotate together.

``fraction`` < 1 rotates only the first R = fraction·head_dim dims (GPT-NeoX's rotary_pct); the
rest pass through untouched. The rotation runs in fp32 and is cast back to the input dtype.

The angles and their cos/sin are computed once per forward (``prepare``), not per layer. The
interleaved pairing is one complex multiplication (pairs viewed as complex numbers, times
e^{i·m·θ}): about 4× faster on a CPU than rotating the halves of each pair separately.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.positions.base import PositionalScheme, Prepared, fp32_positions
from poslab.validate import boolean, number, require

PAIRINGS = ("interleaved", "half")


def rope_theta(rotary_dims: int, base: float) -> Tensor:
    """θ_i = base^(-2i/R), i = 0 .. R/2-1, in fp32."""
    return base ** (-torch.arange(0, rotary_dims, 2, dtype=torch.float32) / rotary_dims)


def rotation(angles: Tensor, pairing: str) -> tuple[Tensor, ...]:
    """What `rotate` needs for angles (T, R/2): e^{i·angle} for interleaved, (cos, sin) for half."""
    if pairing == "interleaved":
        return (torch.polar(torch.ones_like(angles), angles),)
    return torch.cos(angles), torch.sin(angles)


def rotate(x: Tensor, angles_or_rotation: Tensor | tuple[Tensor, ...], pairing: str) -> Tensor:
    """Rotate the pairs of `x` (..., T, R) by angles (T, R/2) (or their `rotation`); fp32."""
    rot = angles_or_rotation
    if isinstance(rot, Tensor):
        rot = rotation(rot, pairing)
    if pairing == "interleaved":
        if torch.compiler.is_compiling():
            # inductor generates no code for complex numbers: the same product in real form
            e = torch.view_as_real(rot[0])
            cos, sin = e[..., 0], e[..., 1]
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
        return torch.view_as_real(pairs * rot[0]).flatten(-2)
    cos, sin = rot
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Rotary(PositionalScheme):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        base: float = 10000.0,
        pairing: str = "interleaved",
        fraction: float = 1.0,
        learnable_theta: bool = False,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.base", base, number(gt=1))  # θ_i = base^(-2i/R) must fall with i
        require("pos.learnable_theta", learnable_theta, boolean())
        require("pos.fraction", fraction, number(gt=0, le=1))
        if pairing not in PAIRINGS:
            raise ConfigError(f"pos.pairing={pairing!r}; choose one of {PAIRINGS}")
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"pos.fraction={fraction} must be in (0, 1]")
        rotary_dims = round(self.head_dim * fraction)
        if rotary_dims % 2 or rotary_dims == 0:
            raise ConfigError(
                f"rope rotates pairs of dims, but pos.fraction={fraction} of head_dim="
                f"{self.head_dim} gives {rotary_dims} dims; choose a fraction giving an even number"
            )
        self.rotary_dims = rotary_dims
        self.pairing = pairing
        self.base = float(base)
        theta = rope_theta(rotary_dims, self.base)
        # The θ of the RoFormer ablation: trainable, shared by all layers and heads, started at
        # base^(-2i/R). theta_init is kept to report how far training moved it. A fixed θ is
        # derived state, rebuilt from pos.base (not saved), so an eval-time base takes effect.
        self.register_buffer("theta_init", theta.clone(), persistent=False)
        if learnable_theta:
            self.theta = nn.Parameter(theta)
        else:
            self.register_buffer("theta", theta, persistent=False)

    def angles(self, positions: Tensor) -> Tensor:
        """(…, T, R/2) fp32 angles m·θ_i for positions (…, T)."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            return fp32_positions(positions)[..., None] * self.theta.float()

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            angles = self.angles(prepared.fp32)
            if angles.dim() == 3:  # per-sequence positions (B, T): a head axis for (B, H, T, D)
                angles = angles[:, None]
            prepared.extra["rope"] = rotation(angles, self.pairing)
        return prepared

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        rot = self.prepared(positions).extra["rope"]
        r = self.rotary_dims
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_rot = rotate(q[..., :r].float(), rot, self.pairing).to(q.dtype)
            k_rot = rotate(k[..., :r].float(), rot, self.pairing).to(k.dtype)
        if r == q.shape[-1]:
            return q_rot, k_rot
        return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)

    def metrics(self) -> dict[str, Tensor]:
        if not isinstance(self.theta, nn.Parameter):
            return {}
        rel = ((self.theta.detach() - self.theta_init) / self.theta_init).abs()
        return {"theta_rel_change_mean": rel.mean(), "theta_rel_change_max": rel.max()}
