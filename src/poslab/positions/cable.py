"""CABLE, Context-aware Biases for Length Extrapolation (Veisi, Amirzadeh, Mansourian 2025,
arXiv 2503.08067): a learned, token-specific ALiBi.

Each head h of each layer projects the layer's normalised input x_t to one number per token,
z_t = w_h·x_t + b_h, and makes it a non-negative penalty softplus(z_t). Query i sees key j with
the score bias

    −Σ_{k=j+1..i} softplus(z_k) = c_i − c_j,    c_t = −Σ_{k≤t} softplus(z_k),

so attention falls off over the tokens between them at a rate the tokens themselves set (ALiBi
is the case of a constant penalty, the slope). This is the reference code's formula
(AlgonetLabs/Cable, formerly axiomlab/Cable, src/Cable.py, `CausalSelfAttention`:
`h_attn = nn.Linear(n_embd, n_head)` on the block's `ln_1` output, then
`b = cumsum(−softplus(h_attn(x)), dim=1)` and `Bias = b_i − b_j` plus the causal mask, added
unscaled to the scores). No positions are read (the reference model has no position
embedding): order enters only through the causal mask and the running sum, so shifting
positions changes nothing. Initialisation as the reference's `_init_weights` for a Linear:
weights normal with std 0.02, bias `bias_init` = 0, so every token first costs
softplus(0) = log 2 ≈ 0.69 per step of distance in every head.

Since −softplus(z) = log σ(−z), CABLE is FoX (positions/fox.py) with the gate's sign flipped;
what differs in practice is the start: FoX's gates begin almost open (a penalty of 0.007 per
token), CABLE's at half (0.69 per token, a strong recency bias from the first step).

What differs from the reference, all outside this module: the kernels scale q·k by 1/√head_dim
(the reference's src/Cable.py divides q and k by √(C/n_embd) = 1, no scaling; its first
Cable.py by 1/√n_embd), the bias being added unscaled in both; the reference runs the
projection under bf16 autocast, here c is fp32 even under bf16 autocast; and poslab's optimizer
gives the scheme's parameters no weight decay (the reference decays the projection's weight by
0.1). The kernels consume c as they do FoX's (attention.decay_attention, attention.CausalBias).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import number, require
from poslab.positions.base import PositionalScheme


class Cable(PositionalScheme):
    needs = "decay"
    reads_positions: ClassVar[bool] = False
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, bias_init: float = 0.0, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.bias_init", bias_init, number())
        self.bias_init = float(bias_init)
        self.per_layer = True  # each layer its own projection, as the reference's blocks
        # one tensor for all layers, as FoX: a layer a schedule gives to another scheme still
        # gets a zero gradient, as DDP expects
        self.proj_weight = nn.Parameter(torch.randn(self.n_layer, n_head, d_model) * 0.02)
        self.proj_bias = nn.Parameter(torch.full((self.n_layer, n_head), self.bias_init))

    def token_bias(self, x: Tensor, layer: int = 0) -> Tensor:
        """−softplus(w·x_t + b) (B, H, T) in fp32 for the layer's input x (B, T, d_model): what
        each token adds to the distance penalty of every query past it (≤ 0)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            weight, bias = self.proj_weight[layer].float(), self.proj_bias[layer].float()
            return -F.softplus(F.linear(x.float(), weight, bias)).transpose(1, 2)

    def data_decay(self, x: Tensor, layer: int = 0) -> Tensor:
        """c (B, H, T): the running sum of the token biases; query i over key j gets c_i − c_j."""
        return self.token_bias(x, layer).cumsum(dim=-1)  # fp32: token_bias runs outside autocast
