"""p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary Positional
Encodings useful?"): rotary on the highest frequencies only.

Of the R/2 rotary pairs, the first ⌊p·R/2⌋ (the highest frequencies) keep rope's
θ_i = base^(−2i/R); the lowest (1 − p) share gets θ_i = 0, so those pairs never turn: on them
q·k is the plain dot product, NoPE. p = 1 is rope, bit for bit; the paper's best is p = 0.75.
Why: the paper finds that trained models use the lowest frequencies as semantic channels, which
rotation only corrupts over long distances; removing it there keeps them robust.

The frequencies are those of Hugging Face's ``proportional`` rope (Gemma's
``partial_rotary_factor``, ``_compute_proportional_rope_parameters``): θ_i = base^(−2i/D) for
the first ⌊p·D/2⌋ pairs, zeros after, the exponent still over the whole width D (unlike
``fraction``, which rotates R < D dims at compressed frequencies base^(−2i/R)). With
``fraction`` < 1 the proportion applies to the R rotated dims.

θ is fixed here: ``learnable_theta`` is refused (a trained θ would leave 0 at once).
"""

from __future__ import annotations

from typing import Any

import torch

from poslab.checks import number, require
from poslab.errors import ConfigError
from poslab.positions.rope import Rotary


def refuse_learnable_theta(scheme: Rotary, name: str, why: str) -> None:
    """The fixed-θ rotary variants: a trainable θ would undo what defines them."""
    if scheme.theta_param is not None:
        raise ConfigError(f"pos={name} fixes θ ({why}); set pos.learnable_theta=false")


def keep_pairs(scheme: Rotary, rotating: torch.Tensor) -> None:
    """θ_i = 0 (no rotation: NoPE on the pair) where `rotating` (R/2,) is False."""
    theta = scheme.frequencies().detach()
    scheme.set_theta(torch.where(rotating, theta, theta.new_zeros(())))
    scheme.rotating_pairs = int(rotating.sum())


class PRope(Rotary):
    def __init__(self, d_model: int, n_head: int, proportion: float = 0.75, **options: Any) -> None:
        super().__init__(d_model, n_head, **options)
        refuse_learnable_theta(self, "p_rope", "the lowest frequencies stay at 0")
        require("pos.proportion", proportion, number(gt=0, le=1))
        self.proportion = float(proportion)
        pairs = self.rotary_dims // 2
        rotating = int(self.proportion * self.rotary_dims // 2)  # as Hugging Face rounds it
        if rotating == 0:
            raise ConfigError(
                f"pos.proportion={proportion} of {self.rotary_dims} rotary dims rotates no pair; "
                f"choose pos.proportion ≥ {2 / self.rotary_dims:g}"
            )
        keep_pairs(self, torch.arange(pairs) < rotating)
