"""DAPE (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation"): a positional bias made data-dependent by a small MLP over the heads.

For every query–key pair (m, n) an MLP f: R^{2H} -> R^H, shared by all pairs, sees the vector of
the H heads' scaled scores and the H heads' biases of a static scheme, and its output is added
to both:

    A_h(m, n) = s_h(m, n) + B_h(m, n) + f([s(m, n) ; B(m, n)])_h,    s = q·k/√d,
    f(x) = W2 · LeakyReLU(W1 · x + b1) + b2     (hidden width `hidden`, LeakyReLU slope 0.01)

B is KERPLE-log (`bias=kerple`, the paper's best), ALiBi or FIRE, built from poslab's own
classes (positions/kerple.py, alibi.py, fire.py) with `bias_options`. As in the reference code
(chuanyang-Zheng/DAPE, megatron/model/positional_embeddings.py: ParallelKerpleLog_C, AliBi_C,
FIRE_C, one module per attention layer) each layer has its own MLP and its own bias parameters
with `per_layer=true`; the MLP's layers start as nn.Linear does (uniform in ±1/√fan_in).

The reference feeds the MLP the scores before the causal mask (its bias is zero above the
diagonal); here the scores and the bias of masked (future) keys enter as 0, so whatever the
kernel passes there (a −inf included) cannot make a NaN, nor a NaN gradient. The MLP acts on
each pair alone, so causality holds once the kernel masks the future. Computed in fp32.

DAPE needs the scores, so it runs with attention=blockwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import boolean, choice, integer, require
from poslab.errors import ConfigError
from poslab.positions.alibi import ALiBi
from poslab.positions.base import PositionalScheme
from poslab.positions.fire import Fire
from poslab.positions.kerple import Kerple

BIASES: dict[str, type[PositionalScheme]] = {"kerple": Kerple, "alibi": ALiBi, "fire": Fire}
LEAKY_SLOPE = 0.01  # nn.LeakyReLU's default, as the reference uses it


class DAPE(PositionalScheme):
    needs = "scores"
    # true for the default bias (kerple) and for alibi: scores and bias depend on m − n only;
    # an instance with bias=fire says False (FIRE normalises by the query's position)
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        bias: str = "kerple",
        hidden: int = 32,
        per_layer: bool = True,
        bias_options: Mapping[str, Any] | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.bias", bias, choice(*BIASES))
        require("pos.hidden", hidden, integer(1))
        require("pos.per_layer", per_layer, boolean())
        if bias_options is not None and not isinstance(bias_options, Mapping):
            raise ConfigError(
                f"pos.bias_options={bias_options!r} must be a mapping of {bias} options, "
                "e.g. {variant: power}"
            )
        self.bias_kind = bias
        self.hidden = hidden
        self.per_layer = per_layer
        self.inner = self._inner(bias, dict(bias_options or {}))
        self.shift_invariant = type(self.inner).shift_invariant  # type: ignore[misc]
        sets, heads = self.n_layer if per_layer else 1, n_head
        # the MLP's two layers, initialised as nn.Linear does (uniform in ±1/√fan_in); inputs
        # are the H scores, then the H biases (the reference's torch.cat((x, bias), dim=1))
        bound1, bound2 = (2 * heads) ** -0.5, hidden**-0.5
        self.w1 = nn.Parameter((torch.rand(sets, 2 * heads, hidden) * 2 - 1) * bound1)
        self.b1 = nn.Parameter((torch.rand(sets, hidden) * 2 - 1) * bound1)
        self.w2 = nn.Parameter((torch.rand(sets, hidden, heads) * 2 - 1) * bound2)
        self.b2 = nn.Parameter((torch.rand(sets, heads) * 2 - 1) * bound2)

    def _inner(self, bias: str, options: dict[str, Any]) -> PositionalScheme:
        """The static bias scheme, with this scheme's sizes and per-layer choice."""
        cls = BIASES[bias]
        if cls is not ALiBi:  # kerple and fire take per_layer; alibi's slopes are fixed
            options.setdefault("per_layer", self.per_layer)
        try:
            return cls(self.d_model, self.n_head, n_layer=self.n_layer, **options)
        except TypeError as err:
            raise ConfigError(
                f"pos.bias_options={options!r} does not suit bias={bias} ({err}); "
                f"see conf/pos/{bias}.yaml for its options"
            ) from None

    def mlp(self, scores: Tensor, bias: Tensor, layer: int) -> Tensor:
        """f([scores; bias]) for scores (B, H, Tq, Tk) and a bias broadcastable to them
        ((H, Tq, Tk) or (B, H, Tq, Tk)) -> (B, H, Tq, Tk), fp32."""
        i = self.layer_index(layer)
        heads = self.n_head
        w1 = self.w1[i].float()
        # W1·[s; B] = W1_s·s + W1_B·B: the bias half once, not once per sequence
        hidden = torch.einsum("bhqk,hw->bqkw", scores, w1[:heads])
        hidden = hidden + torch.einsum("...hqk,hw->...qkw", bias, w1[heads:])
        hidden = F.leaky_relu(hidden + self.b1[i].float(), LEAKY_SLOPE)
        out = torch.einsum("bqkw,wh->bhqk", hidden, self.w2[i].float())
        return out + self.b2[i].float()[:, None, None]

    def modify_scores(
        self,
        scores: Tensor,
        q: Tensor,
        k: Tensor,
        future: Tensor,
        q_positions: Tensor,
        k_positions: Tensor,
        layer: int = 0,
    ) -> Tensor:
        with torch.autocast(device_type=scores.device.type, enabled=False):
            scores = scores.float()
            bias = self.inner.attention_bias(q_positions, k_positions, layer).float()
            # the MLP sees 0 for masked keys: no −inf (nor a far-away bias) reaches it
            seen_scores = scores.masked_fill(future, 0.0)
            seen_bias = bias.masked_fill(future, 0.0)
            return scores + seen_bias + self.mlp(seen_scores, seen_bias, layer)

    def check_length(self, max_position: int) -> None:
        self.inner.check_length(max_position)

    def metrics(self) -> dict[str, Tensor]:
        return self.inner.metrics()
