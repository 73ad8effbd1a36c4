"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025): a data-dependent ALiBi.

Each head of each layer has a forget gate per token, f_t = σ(w·x_t + b), from the layer's
normalised input x_t. Query i sees key j with the score bias

    Σ_{k=j+1..i} log f_k = c_i − c_j,    c_t = Σ_{k≤t} log f_k,

so attention decays over distance at a rate the tokens set (ALiBi is the case of a constant
gate). No positions are read: order enters only through the causal mask and the running sum,
so shifting positions changes nothing. The gate's bias starts at `bias_init` = 5 (σ(5) ≈ 0.993:
little forgetting at first), as x-transformers' `DataDependentAlibi` does; its weights like the
model's linear layers (normal, std 0.02).

The kernel adds c_i − c_j to the scores (flex: in `score_mod`; blockwise: to the explicit
scores). sdpa uses that softmax ignores a constant per query: the bias is −c_j, carried as one
more key dimension through the fused kernel in fp32, with no (T, T) matrix
(attention.decay_attention); with dropout or a window, and on a GPU under bf16, it builds
the bias matrix, rounded to the scores' dtype like every bias (attention.CausalBias). c is
computed in fp32 even under bf16 autocast.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import number, require
from poslab.positions.base import PositionalScheme


class Forgetting(PositionalScheme):
    needs = "decay"
    reads_positions: ClassVar[bool] = False
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, bias_init: float = 5.0, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.bias_init", bias_init, number())
        self.bias_init = float(bias_init)
        self.per_layer = True  # each layer its own gates (a layer's input is its own)
        # one tensor for all layers (not a module per layer): a layer that does not use its gates
        # (FoX in some layers of a schedule) still gets a zero gradient, as DDP expects
        self.gate_weight = nn.Parameter(torch.randn(self.n_layer, n_head, d_model) * 0.02)
        self.gate_bias = nn.Parameter(torch.full((self.n_layer, n_head), self.bias_init))

    def upgrade_state(self, state: dict[str, Tensor], prefix: str = "pos.") -> dict[str, Tensor]:
        """Checkpoints whose gates were one Linear per layer (`gates.<i>.weight`, `.bias`)."""
        state = super().upgrade_state(state, prefix)
        old = [f"{prefix}gates.{i}." for i in range(self.n_layer)]
        if f"{old[0]}weight" in state:
            state = dict(state)
            weights = [state.pop(f"{o}weight") for o in old]
            biases = [state.pop(f"{o}bias") for o in old]
            state[f"{prefix}gate_weight"] = torch.stack(weights)
            state[f"{prefix}gate_bias"] = torch.stack(biases)
        return state

    def log_forget(self, x: Tensor, layer: int = 0) -> Tensor:
        """log f (B, H, T) in fp32 for the layer's input x (B, T, d_model)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            weight, bias = self.gate_weight[layer].float(), self.gate_bias[layer].float()
            return F.logsigmoid(F.linear(x.float(), weight, bias)).transpose(1, 2)

    def data_decay(self, x: Tensor, layer: int = 0) -> Tensor:
        """c (B, H, T): the running sum of log f; the bias of query i over key j is c_i − c_j."""
        return self.log_forget(x, layer).cumsum(dim=-1)  # fp32: log_forget runs outside autocast
