"""A GPT-style decoder (pre-LayerNorm blocks, causal self-attention, GELU MLP, tied embeddings).

The positional scheme is one module shared by all layers; the model calls its hooks (`prepare`
once per forward, then `embed`, and `rotate` with the layer index) and hands it to the attention
kernel (attention.py), which calls the score hooks the scheme needs. Neither asks which scheme
it is.
The training loss fuses the output projection with the cross-entropy, in chunks of tokens
(losses.py), so the (tokens × vocab) logits never exist at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, AttentionKernel
from poslab.model.losses import linear_cross_entropy
from poslab.positions.base import PositionalScheme, Prepared

GATES = (None, "headwise", "elementwise")


@dataclass
class GPTConfig:
    vocab_size: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers
    # multiply token embeddings by sqrt(d_model) (Vaswani et al.; fairseq, the ALiBi paper's
    # code): added position vectors of unit amplitude then meet token vectors of similar size
    scale_embeddings: bool = False
    # gated attention (Qiu et al. 2025, arXiv 2505.06708, their G1): each head's output times
    # σ(x W_g), x the layer's normalised input; one gate per head ("headwise") or per output
    # dimension ("elementwise"); null: no gate
    gate: str | None = None
    # attention sinks (gpt-oss): a learned logit per layer and head in every query's softmax,
    # as a key with a zero value; it starts at 0
    sinks: bool = False

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise ConfigError(
                f"model.gate={self.gate!r}; choose null (no gate), headwise or elementwise"
            )
        if not isinstance(self.sinks, bool):
            raise ConfigError(f"model.sinks={self.sinks!r}; choose true or false")
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}"
            )
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        # None without a gate (and without sinks): the state dict of an ungated model is unchanged
        width = {"headwise": config.n_head, "elementwise": config.d_model}.get(config.gate)
        self.gate = nn.Linear(config.d_model, width, bias=config.bias) if width else None
        self.sinks = nn.Parameter(torch.zeros(config.n_head)) if config.sinks else None

    def forward(
        self,
        x: Tensor,
        prepared: Prepared,
        pos: PositionalScheme,
        kernel: AttentionKernel,
        state: Any,
        layer: int,
    ) -> Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq_len, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if not kernel.rotates_inside:
            q, k = pos.rotate(q, k, prepared, layer)
        dropout = self.dropout if self.training else 0.0
        decay = pos.data_decay(x, layer)  # a data-dependent bias (FoX), None for most schemes
        data = pos.layer_data(x, layer)  # what the score hook reads from x (PaTH), or None
        y = kernel(q, k, v, pos, prepared, state, layer, dropout, decay, self.sinks, data)
        y = y.transpose(1, 2)  # (B, T, H, head_dim)
        if self.gate is not None:  # (B, T, H, 1) headwise or (B, T, H, head_dim) elementwise
            y = y * torch.sigmoid(self.gate(x)).view(batch, seq_len, self.n_head, -1)
        return self.resid_dropout(self.proj(y.reshape(batch, seq_len, d_model)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        prepared: Prepared,
        pos: PositionalScheme,
        kernel: AttentionKernel,
        state: Any,
        layer: int,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), prepared, pos, kernel, state, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self, config: GPTConfig, pos: PositionalScheme, attention: AttentionKernel | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.pos = pos
        self.attention = attention or SDPA()
        self.attention.check(pos, config.dropout, config.sinks)  # an impossible pairing fails here
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied input/output embeddings
        # the scheme initialises its own parameters (e.g. T5's zero bias table)
        for module in (self.tok_emb, self.blocks, self.ln_f):
            module.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def check_positions(self, idx: Tensor, positions: Tensor) -> None:
        batch, seq_len = idx.shape
        axes = (self.pos.position_axes,) if self.pos.position_axes else ()
        shared, per_sequence = (seq_len, *axes), (batch, seq_len, *axes)
        if tuple(positions.shape) not in (shared, per_sequence):
            raise ConfigError(
                f"positions must have shape {shared} (shared by the batch) or {per_sequence} "
                f"(per sequence), got {tuple(positions.shape)}"
            )

    def hidden_states(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """Token ids (B, T) and positions ((T,) or (B, T)) -> final normalised states (B, T, d).
        Without positions the scheme gives them: 0..T−1 (randomized in training, if set). A
        multi-axis scheme takes (…, T, A), or token positions (…, T) of text (the same id on
        every axis)."""
        if positions is None:
            positions = self.pos.positions(idx.shape[0], idx.shape[1], idx.device)
        elif self.pos.position_axes and tuple(positions.shape) in (idx.shape[1:], idx.shape):
            positions = self.pos.text_positions(positions)  # token positions: text
        self.check_positions(idx, positions)
        tokens = self.tok_emb(idx)
        if self.config.scale_embeddings:
            tokens = tokens * math.sqrt(self.config.d_model)
        # position-only work once per forward, for every layer: angles, cos/sin, the bias
        prepared = self.pos.prepare(positions)
        state = self.attention.begin(self.pos, prepared, tokens.dtype)
        x = self.drop(self.pos.embed(tokens, prepared))
        for layer, block in enumerate(self.blocks):
            x = block(x, prepared, self.pos, self.attention, state, layer)
        return self.ln_f(x)

    def forward(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab)."""
        return self.lm_head(self.hidden_states(idx, positions))

    def loss(self, idx: Tensor, targets: Tensor, positions: Tensor | None = None) -> Tensor:
        """Mean next-token cross-entropy (targets of -100 are ignored), fused with the output
        projection so that the logits are never materialised."""
        hidden = self.hidden_states(idx, positions)
        return linear_cross_entropy(hidden, self.lm_head.weight, targets)

    def num_parameters(self, non_embedding: bool = True) -> int:
        total = sum(p.numel() for p in self.parameters())
        return total - self.tok_emb.weight.numel() if non_embedding else total
