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

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import boolean, number, require
from poslab.errors import ConfigError
from poslab.positions.base import PositionalScheme, Prepared
from poslab.positions.rope_scaling import RopeScaling

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


THETA_PARAMS = ("raw", "log")


class Rotary(PositionalScheme):
    eval_scaling = True  # takes eval.rope_scaling / eval.logn_scaling (its `scaling` option)
    droppable: ClassVar[bool] = True  # DroPE drops the rotation (extend=RUN pos=nope)
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        base: float = 10000.0,
        pairing: str = "interleaved",
        fraction: float = 1.0,
        learnable_theta: bool = False,
        theta_param: str = "raw",
        scaling: dict[str, Any] | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.base", base, number(gt=1))  # θ_i = base^(-2i/R) must fall with i
        require("pos.learnable_theta", learnable_theta, boolean())
        require("pos.fraction", fraction, number(gt=0, le=1))
        if pairing not in PAIRINGS:
            raise ConfigError(f"pos.pairing={pairing!r}; choose one of {PAIRINGS}")
        if theta_param not in THETA_PARAMS:
            raise ConfigError(f"pos.theta_param={theta_param!r}; choose one of {THETA_PARAMS}")
        rotary_dims = round(self.head_dim * fraction)
        if rotary_dims % 2 or rotary_dims == 0:
            raise ConfigError(
                f"rope rotates pairs of dims, but pos.fraction={fraction} of head_dim="
                f"{self.head_dim} gives {rotary_dims} dims; choose a fraction giving an even number"
            )
        self.rotary_dims = rotary_dims
        self.pairing = pairing
        self.base = float(base)
        self.theta_param = theta_param if learnable_theta else None
        self.set_theta(rope_theta(rotary_dims, self.base))
        # eval-time context extension (rope_scaling.py): set through eval.rope_scaling
        self.scaling = RopeScaling.from_options(scaling)
        if self.scaling is not None:
            self.scaling.check_dims(rotary_dims)
            if self.scaling.needs_scores:  # rerope, selfextend, lminfinite
                self.needs = "scores"  # two score matrices merged by distance: the raw scores

    def set_theta(self, theta: Tensor) -> None:
        """Start θ at `theta` (R/2,): fixed, or trainable as `theta_param` says.

        The θ of the RoFormer ablation: trainable, shared by all layers and heads, started at
        base^(-2i/R), learned as is (`raw`: Adam moves each θ_i by about the learning rate per
        step, a huge relative step for the low frequencies) or as log θ (`log`: every step a
        relative change). theta_init is kept to report how far training moved it. A fixed θ is
        derived state, rebuilt from pos.base (not saved), so an eval-time base takes effect."""
        self.register_buffer("theta_init", theta.clone(), persistent=False)
        if self.theta_param is None:
            self.register_buffer("theta", theta, persistent=False)
        elif self.theta_param == "raw":
            self.theta = nn.Parameter(theta)
        else:
            self.log_theta = nn.Parameter(theta.log())

    def frequencies(self) -> Tensor:
        """θ_i (fp32), as trained."""
        if self.theta_param == "log":
            return self.log_theta.float().exp()
        return self.theta.float()

    def angles(
        self, positions: Tensor, length: int | None = None, per_pair: bool = False
    ) -> Tensor:
        """(…, T, R/2) fp32 angles m·θ_i for fp32 positions (…, T), with the eval-time scaling
        of a forward over `length` positions (default: the last axis of `positions`).
        `per_pair`: positions (…, T, R/2), one per pair (dpe's far positions)."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            theta = self.frequencies()
            scaling = self.scaling
            if per_pair:
                return positions * theta
            if scaling is not None:
                length = length or positions.shape[-1]
                theta = scaling.theta(theta, self.rotary_dims, length, self.base)
                positions = positions * scaling.position_scale
            if self.position_dtype == "bf16":  # the bug, on purpose: the product in bf16
                bf16 = torch.bfloat16
                return (positions.to(bf16)[..., None] * theta.to(bf16)).float()
            return positions[..., None] * theta

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            length = positions.shape[-1]
            if self.scaling is not None and self.scaling.reads_length:  # dynamic_ntk, longrope
                # HF: the largest position + 1; here the window's span, so that a position
                # offset (eval.position_offset) leaves a relative scheme unchanged
                span = prepared.fp32.amax(dim=-1) - prepared.fp32.amin(dim=-1)
                length = int(span.max()) + 1
            angles = self.angles(prepared.fp32, length)
            if angles.dim() == 3:  # per-sequence positions (B, T): a head axis for (B, H, T, D)
                angles = angles[:, None]
            rot = rotation(angles, self.pairing)
            if self.scaling is not None and self.scaling.attention_factor != 1:
                # YaRN's temperature, LongRoPE's attention factor
                rot = tuple(r * self.scaling.attention_factor for r in rot)
            prepared.extra["rope"] = rot
            if self.scaling is not None and self.scaling.logn:
                logn = self.scaling.query_scale(prepared.fp32)[..., None]  # (…, T, 1)
                prepared.extra["logn"] = logn[:, None] if logn.dim() == 3 else logn
        return prepared

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        prepared = self.prepared(positions)
        if "logn" in prepared.extra:
            with torch.autocast(device_type=q.device.type, enabled=False):
                q = (q.float() * prepared.extra["logn"]).to(q.dtype)
        if self.needs == "scores":  # rerope, selfextend, lminfinite rotate in modify_scores
            return q, k
        rot = prepared.extra["rope"]
        return self._rotate(q, rot), self._rotate(k, rot)

    def _rotate(self, x: Tensor, rot: tuple[Tensor, ...]) -> Tensor:
        """The rotary dims of x (…, T, D) turned by `rot` in fp32; the others pass through."""
        r = self.rotary_dims
        with torch.autocast(device_type=x.device.type, enabled=False):
            turned = rotate(x[..., :r].float(), rot, self.pairing).to(x.dtype)
        return turned if r == x.shape[-1] else torch.cat((turned, x[..., r:]), dim=-1)

    def modify_scores(
        self,
        scores: Tensor,
        q: Tensor,
        k: Tensor,
        future: Tensor,
        q_positions: Tensor,
        k_positions: Tensor,
        layer: int = 0,
        data: Any = None,
    ) -> Tensor:
        """Plain rotary scores for keys closer than the window, and beyond it the scores of
        queries and keys turned to other positions (positions/extensions/, `far_positions`):

        * rerope: queries at the window w over keys at 0 (leaky: w + (m − n − w)/k);
        * selfextend: queries at ⌊m/G⌋ + w − ⌊w/G⌋ over keys at ⌊n/G⌋, m and n counted from
          the window's first position;
        * lminfinite: rerope with w = L (distances capped at L), and −inf for keys neither
          among the first n_global tokens nor closer than its local window;
        * string: queries S − W closer beyond the shift S;
        * dpe: selfextend with a group size per band of pairs."""
        scaling = self.scaling
        window = scaling.local_window()
        distance = q_positions[..., :, None] - k_positions[..., None, :]
        if distance.dim() == 3:  # per-sequence positions: a head axis
            distance = distance[:, None]
        cap, far_q, far_k = scaling.far_positions(q_positions, k_positions, window)
        scores = self._merged_scores(q, k, q_positions, k_positions, distance < cap, far_q, far_k)
        seen = scaling.seen(distance, window)  # lminfinite's Λ
        if seen is not None:
            scores = scores.masked_fill(~seen, float("-inf"))  # the diagonal is always seen
        return scores

    def _merged_scores(
        self,
        q: Tensor,
        k: Tensor,
        q_positions: Tensor,
        k_positions: Tensor,
        near: Tensor,
        far_q: Tensor,
        far_k: Tensor | None,
    ) -> Tensor:
        """The scaled scores of q and k rotated at their positions where `near`, else of q
        rotated at `far_q` over k at `far_k` (None: k unrotated, i.e. at 0): two score
        matrices merged by a distance mask, as bojone/rerope and datamllab/LongLM do."""
        scale = q.shape[-1] ** -0.5
        # cos/sin times the kind's attention factor (STRING's temperature), as `prepare` does:
        # only the rotated dims carry it (as YaRN's and HF's), never a fraction < 1's others
        factor = self.scaling.attention_factor

        def turned(x: Tensor, positions: Tensor) -> Tensor:
            if positions.dim() > q_positions.dim():  # per band of pairs (dpe): each pair's
                pairs = self.rotary_dims // 2
                positions = positions.repeat_interleave(pairs // positions.shape[-1], dim=-1)
                angles = self.angles(positions, per_pair=True)
            else:
                angles = self.angles(positions)
            if angles.dim() == 3:  # per-sequence positions: a head axis
                angles = angles[:, None]
            rot = rotation(angles, self.pairing)
            return self._rotate(x, rot if factor == 1 else tuple(r * factor for r in rot))

        near_scores = turned(q, q_positions) @ turned(k, k_positions).transpose(-1, -2) * scale
        if far_k is None:  # k at position 0: unrotated, its rotated dims times the factor
            far_keys = k if factor == 1 else turned(k, torch.zeros_like(k_positions))
        else:
            far_keys = turned(k, far_k)
        far_scores = turned(q, far_q) @ far_keys.transpose(-1, -2) * scale
        return torch.where(near, near_scores, far_scores)

    @property
    def reads_length(self) -> bool:
        return self.scaling is not None and self.scaling.reads_length  # dynamic_ntk, longrope

    @property
    def scales_scores(self) -> bool:
        scaling = self.scaling
        return scaling is not None and (scaling.logn or scaling.attention_factor != 1)

    def after_training(self, out: Any, run: str = "", seed: Any = None) -> list[Any]:
        """A learnable θ: θ_i/θ_i(init) per frequency, <out>/theta.png and theta.csv."""
        if self.theta_param is None:
            return []
        from poslab.positions.rope_theta import plot_theta, theta_ratio_rows

        rows = theta_ratio_rows(self, f"θ {self.theta_param}", run, seed)
        return [plot_theta(rows, out)]

    def metrics(self) -> dict[str, Tensor]:
        if self.theta_param is None:
            return {}
        theta = self.frequencies().detach()
        rel = ((theta - self.theta_init) / self.theta_init).abs()
        return {"theta_rel_change_mean": rel.mean(), "theta_rel_change_max": rel.max()}
