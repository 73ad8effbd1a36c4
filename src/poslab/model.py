"""A GPT-style decoder (pre-LayerNorm blocks, causal self-attention, GELU MLP, tied embeddings).

The positional scheme is one module shared by all layers; the model calls its hooks (`prepare`
once per forward, then `embed`, `rotate`, `attention_bias`) and never asks which scheme it is.
The training loss fuses the output projection with the cross-entropy, in chunks of tokens
(losses.py), so the (tokens × vocab) logits never exist at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.attention import (
    KERNELS,
    AttentionBias,
    CausalBias,
    FlexMask,
    causal_attention,
    flex_causal_attention,
)
from poslab.errors import ConfigError
from poslab.losses import linear_cross_entropy
from poslab.positions.base import PositionalScheme, Prepared
from poslab.precision import compute_dtype


@dataclass
class GPTConfig:
    vocab_size: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers
    attn_block_size: int = 1024  # query block of the bias-aware attention path
    attention: str = "sdpa"  # the attention kernel: sdpa | flex (attention.py)
    # multiply token embeddings by sqrt(d_model) (Vaswani et al.; fairseq, the ALiBi paper's
    # code): added position vectors of unit amplitude then meet token vectors of similar size
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}"
            )
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        if self.attention not in KERNELS:
            raise ConfigError(f"model.attention={self.attention!r}; choose one of {KERNELS}")
        if self.attention == "flex" and self.dropout > 0:
            raise ConfigError(
                "model.attention=flex has no attention dropout; set model.dropout=0 or use "
                "model.attention=sdpa"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        prepared: Prepared,
        pos: PositionalScheme,
        bias: AttentionBias,
    ) -> Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq_len, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        q, k = pos.rotate(q, k, prepared)
        if isinstance(bias, FlexMask):
            y = flex_causal_attention(q, k, v, bias)
        else:
            dropout = self.dropout if self.training else 0.0
            y = causal_attention(q, k, v, prepared.fp32, dropout_p=dropout, bias=bias)
        y = y.transpose(1, 2).contiguous().view(batch, seq_len, d_model)
        return self.resid_dropout(self.proj(y))


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
        bias: AttentionBias,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), prepared, pos, bias)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, pos: PositionalScheme) -> None:
        super().__init__()
        self.config = config
        self.pos = pos
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

    def default_positions(self, seq_len: int, device: torch.device, offset: int = 0) -> Tensor:
        return torch.arange(offset, offset + seq_len, device=device)

    def hidden_states(self, idx: Tensor, positions: Tensor | None = None) -> Tensor:
        """Token ids (B, T) and positions (T,) -> final normalised hidden states (B, T, d)."""
        if positions is None:
            positions = self.default_positions(idx.shape[1], idx.device)
        if positions.dim() != 1 or positions.shape[0] != idx.shape[1]:
            raise ConfigError(
                f"positions must be a 1-D tensor with one entry per token ({idx.shape[1]}), "
                f"got shape {tuple(positions.shape)}"
            )
        tokens = self.tok_emb(idx)
        if self.config.scale_embeddings:
            tokens = tokens * math.sqrt(self.config.d_model)
        # position-only work once per forward, for every layer: angles, cos/sin, the bias
        prepared = self.pos.prepare(positions)
        bias = self.attention_bias(prepared, tokens.dtype)
        x = self.drop(self.pos.embed(tokens, prepared))
        for block in self.blocks:
            x = block(x, prepared, self.pos, bias)
        return self.ln_f(x)

    def attention_bias(self, prepared: Prepared, dtype: torch.dtype) -> AttentionBias:
        """What the attention kernel needs for this forward's positions (None: plain causal)."""
        has_bias = self.pos.has_attention_bias
        if self.config.attention == "flex":
            return FlexMask(self.pos.score_bias if has_bias else None, prepared.fp32)
        if not has_bias:
            return None
        return CausalBias(
            self.pos.attention_bias,
            prepared.fp32,
            self.config.n_head,
            compute_dtype(dtype, prepared.fp32.device.type),
            self.config.attn_block_size,
        )

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
