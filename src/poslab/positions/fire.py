"""FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): the bias is a small learned function of a normalised distance.

    bias(m, n) = f(ψ(m − n) / ψ(max(L, m))),   ψ(x) = log(c·x + 1)

f is an MLP (1 → `width` → one output per head, ReLU), c > 0 and the threshold L > 0 are learned
(used as |c|, |L|, initialised at `c_init` and `threshold_init`). The input lies in [0, 1] for
every causal pair, so the bias stays in the range f takes on [0, 1] at any length: long
sequences are interpolated into the range seen in training (progressive interpolation), not
extrapolated. Below the threshold (m ≤ L) the bias depends on m − n alone. Shared by the layers
by default (`per_layer=true`: one FIRE per layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from poslab.checks import boolean, integer, number, require
from poslab.positions.base import PositionalScheme, fp32_positions

# rows of the (rows × keys × width) hidden activations computed at once: about 64 MB in fp32
HIDDEN_BYTES = 64 * 2**20


class Fire(PositionalScheme):
    needs = "bias"

    def __init__(
        self,
        d_model: int,
        n_head: int,
        width: int = 32,
        c_init: float = 0.1,
        threshold_init: float = 512.0,
        per_layer: bool = False,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.width", width, integer(1))
        require("pos.c_init", c_init, number(gt=0))
        require("pos.threshold_init", threshold_init, number(gt=0))
        require("pos.per_layer", per_layer, boolean())
        self.per_layer = per_layer
        sets = self.n_layer if per_layer else 1
        self.c = nn.Parameter(torch.full((sets,), float(c_init)))
        self.threshold = nn.Parameter(torch.full((sets,), float(threshold_init)))
        # the MLP's two layers, initialised as nn.Linear does (uniform in ±1/√fan_in)
        self.hidden = nn.Parameter(torch.rand(sets, width) * 2 - 1)
        self.hidden_bias = nn.Parameter(torch.rand(sets, width) * 2 - 1)
        bound = width**-0.5
        self.out = nn.Parameter((torch.rand(sets, width, n_head) * 2 - 1) * bound)
        self.out_bias = nn.Parameter((torch.rand(sets, n_head) * 2 - 1) * bound)

    def normalized_distance(self, q_position: Tensor, k_position: Tensor, layer: int) -> Tensor:
        """ψ(m − n) / ψ(max(L, m)) for broadcastable fp32 positions: in [0, 1] when n ≤ m."""
        threshold = self.threshold[self.layer_index(layer)].float().abs()
        distance = (q_position - k_position).clamp(min=0)  # future keys are masked anyway
        denominator = self.psi(torch.maximum(q_position, threshold), layer)
        return self.psi(distance, layer) / denominator.clamp(min=1e-6)

    def psi(self, x: Tensor, layer: int) -> Tensor:
        """ψ(x) = log(|c|·x + 1) of the layer's c."""
        return torch.log1p(self.c[self.layer_index(layer)].float().abs() * x)

    def mlp(self, x: Tensor, layer: int) -> Tensor:
        """f(x) for inputs (...) -> (..., H)."""
        i = self.layer_index(layer)
        hidden = torch.relu(x[..., None] * self.hidden[i].float() + self.hidden_bias[i].float())
        return hidden @ self.out[i].float() + self.out_bias[i].float()

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        x = self.normalized_distance(q_position, k_position, layer)
        i = self.layer_index(layer)
        hidden = torch.relu(x[..., None] * self.hidden[i].float() + self.hidden_bias[i].float())
        weights = self.out[i].float().t()[head]  # (..., width) for the given heads
        return (hidden * weights).sum(-1) + self.out_bias[i].float()[head]

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, layer: int = 0) -> Tensor:
        """The bias (…, H, Tq, Tk). Query rows below the threshold depend on m − n alone, so
        for consecutive positions (training, evaluation) the MLP runs once per distance and the
        rows are gathered from that table; every other row runs the MLP once per (query, key)
        pair for all heads, in chunks of query rows within HIDDEN_BYTES."""
        with torch.autocast(device_type=q_positions.device.type, enabled=False):
            q = fp32_positions(q_positions)
            k = fp32_positions(k_positions)
            below = self._rows_by_distance(q, k, layer)
            if below == q.shape[-1]:
                return self._bias_by_distance(q, k, layer)
            if below:
                head = self._bias_by_distance(q[:below], k, layer)
                return torch.cat([head, self._bias_by_pair(q[below:], k, layer)], dim=-2)
            return self._bias_by_pair(q, k, layer)

    def _rows_by_distance(self, q: Tensor, k: Tensor, layer: int) -> int:
        """How many leading query rows take the distance table: 0 unless q and k are 1-D runs
        of consecutive integers; then the rows whose position is below the threshold."""
        if q.dim() != 1 or k.dim() != 1 or not len(q) or not len(k):
            return 0
        if not (_consecutive(q) and _consecutive(k)):
            return 0
        threshold = self.threshold[self.layer_index(layer)].detach().abs()
        return int((q < threshold).sum())

    def _bias_by_distance(self, q: Tensor, k: Tensor, layer: int) -> Tensor:
        """(H, Tq, Tk) for consecutive q and k with every q below the threshold: the MLP on
        ψ(d)/ψ(L) for each distance d, gathered (future keys take d = 0, as in the pair path)."""
        offset = int(q[0] - k[0])  # m − n of the first query and the first key
        largest = max(0, offset + len(q) - 1)
        distances = torch.arange(largest + 1, device=q.device, dtype=torch.float32)
        threshold = self.threshold[self.layer_index(layer)].float().abs()
        x = self.psi(distances, layer) / self.psi(threshold, layer).clamp(min=1e-6)
        table = self.mlp(x, layer)  # (distances, H)
        rows = torch.arange(len(q), device=q.device)[:, None]
        cols = torch.arange(len(k), device=q.device)[None, :]
        return table[(offset + rows - cols).clamp(min=0)].movedim(-1, -3)

    def _bias_by_pair(self, q: Tensor, k: Tensor, layer: int) -> Tensor:
        width = self.hidden.shape[-1]
        rows = max(1, HIDDEN_BYTES // (4 * width * k.shape[-1] * max(1, q[..., :1].numel())))
        chunks = []
        for start in range(0, q.shape[-1], rows):
            x = self.normalized_distance(q[..., start : start + rows, None], k[..., None, :], layer)
            chunks.append(self.mlp(x, layer))  # (…, rows, Tk, H)
        bias = torch.cat(chunks, dim=-3)
        return bias.movedim(-1, -3)  # (…, H, Tq, Tk)


def _consecutive(positions: Tensor) -> bool:
    """Whether 1-D fp32 positions are p, p + 1, p + 2, … (integers)."""
    first = positions[0]
    expected = first + torch.arange(len(positions), device=positions.device, dtype=positions.dtype)
    return bool(first == first.round()) and torch.equal(positions, expected)
