"""GRAPE-AP (Zhang et al. 2025, "Group Representational Position Encoding", arXiv 2512.07805,
§5): path-integral Additive GRAPE, a causal score bias summed along the path from key to query.

Each head h has a positional feature p_t of every token. Query t sees key j with the bias

    b_h(t, j) = Σ_{ℓ=j+1..t} ψ_h(t, ℓ),    ψ_h(t, ℓ) = α_h · log σ(⟨p_t, R_ℓ p̂_ℓ⟩ / d) ≤ 0,

p̂ = p / rms(p) (no weights), R_ℓ the rotation of every pair (i, i + d/2) of p's d dims by the
angle ℓ (the key's position, one radian per position: the reference's rotary with base 1), and
α_h ALiBi's slopes (fixed). Each edge ℓ of the path is gated by the query, so the bias falls
with distance at a rate the content sets; 0 on the diagonal and non-increasing as j moves back.
In the paper's unipotent lift each edge is a factor I + ψ E with E² = 0, so the path's product
is I + b E (Eq. 5.4). Edges that ignore the query give ALiBi (ψ = −α: p = 0 here gives
α·log 2 per step) and FoX (ψ = log f_ℓ: pos=fox). Reference: model-architectures/GRAPE,
model/llama-mha-grape-ap-v1.py (commit 431bad17): the slopes (lines 47–61), the rotary with
base 1 (126–128), the bias (170–185; p_t raw on the query side, normalised on the key side, as
there, where the paper's Eq. 5.1 normalises both).

p comes from the layer's normalised input x, p = W x per head (`p_dim` = 8 dims, the paper's
runs; W started normal with std 0.5/√d_model, the reference's init_llama_mha_weights for a
hidden matrix), through `layer_data`; or p is the head's key itself with p_dim=null (the
reference's `pktie`, though poslab has no QK-RMSNorm before it). The angle ℓ is the scheme's
position of the key (0..T−1 in evaluation, the reference's token index; randomized or offset
positions where given), so the bias is not a function of t − j alone. The reference builds the
(T, T) bias for SDPA; here it is built per block of queries.

Needs the scores (query t's own key is the last of the keys a block of queries is given), so it
runs on the blockwise kernel. fp32 throughout, angles included, whatever the autocast dtype.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.positions.alibi import alibi_slopes
from poslab.positions.base import PositionalScheme


def _even(value: int | None) -> str | None:
    if value is None or value % 2 == 0:
        return None
    return "must be even (R_ℓ turns pairs of dims), e.g. 8 as the paper's runs"


class GrapeAP(PositionalScheme):
    needs = "scores"
    # R_ℓ turns the key's feature by its own position ℓ, not by t − ℓ: an offset shows
    shift_invariant: ClassVar[bool] = False

    def __init__(self, d_model: int, n_head: int, p_dim: int | None = 8, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.p_dim", p_dim, integer(2, null=True))
        require("pos.p_dim", p_dim, _even)
        if p_dim is None and self.head_dim % 2:
            raise ConfigError(
                f"pos.p_dim=null takes the head dim {self.head_dim}, which is odd; R_ℓ turns "
                "pairs of dims: set pos.p_dim to an even number"
            )
        self.p_dim = p_dim
        self.per_layer = True  # each layer its own keys (and projection), as the reference
        slopes = torch.tensor(alibi_slopes(n_head), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)  # rebuilt from the rule
        self.projection = None
        if p_dim is not None:  # the reference's c_p, one per layer: (H · p_dim) × d_model
            shape = (self.n_layer, n_head, p_dim, d_model)
            self.projection = nn.Parameter(torch.randn(shape) * 0.5 * d_model**-0.5)

    def layer_data(self, x: Tensor, layer: int = 0) -> Tensor | None:
        """p (B, H, T, p_dim) in fp32 from the layer's normalised input x (B, T, d_model);
        None with p_dim=null (p is then the key)."""
        if self.projection is None:
            return None
        with torch.autocast(device_type=x.device.type, enabled=False):
            weight = self.projection[self.layer_index(layer)].float()  # (H, p_dim, d_model)
            return torch.einsum("btd,hpd->bhtp", x.float(), weight)

    def edge_potentials(self, p: Tensor, k_positions: Tensor, queries: int) -> Tensor:
        """ψ (B, H, Tq, Tk) for the last `queries` tokens of p (B, H, Tk, d) over all of them,
        the keys at positions (…, Tk): α_h · log σ(⟨p_t, R_ℓ p̂_ℓ⟩ / d)."""
        unit = F.rms_norm(p, (p.shape[-1],))
        angle = self.position_values(k_positions)[..., None, :, None]  # (…, 1, Tk, 1) fp32
        cos, sin = angle.cos(), angle.sin()
        a, b = unit.chunk(2, dim=-1)  # the reference's pairs (i, i + d/2) and its sign
        turned = torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)
        logits = p[..., -queries:, :] @ turned.transpose(-1, -2) / p.shape[-1]
        return self.slopes[:, None, None] * F.logsigmoid(logits)

    @staticmethod
    def path_sum(potentials: Tensor, future: Tensor) -> Tensor:
        """b(t, j) = Σ_{ℓ=j+1..t} ψ(t, ℓ): the sum over the later keys a query sees. A suffix
        sum, not the reference's row total minus a prefix sum, so that a near key's bias is not
        the difference of two long sums (in fp32 the near keys count most)."""
        seen = potentials.masked_fill(future, 0.0)
        suffix = seen.flip(-1).cumsum(-1).flip(-1)  # Σ_{ℓ≥j}
        return F.pad(suffix[..., 1:], (0, 1))

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
        with torch.autocast(device_type=scores.device.type, enabled=False):
            # p of the keys 0..Tk−1: from x (layer_data), or the keys themselves (tied)
            p = k.float() if data is None else data[..., : k.shape[-2], :].float()
            # a block of Tq queries comes with the keys up to its last query (blockwise), so
            # query r's own token is key Tk − Tq + r: its p is the query side's
            potentials = self.edge_potentials(p, k_positions, scores.shape[-2])
            return scores.float() + self.path_sum(potentials, future)
