"""A GPT-style decoder (pre-LayerNorm blocks, causal self-attention, GELU MLP, tied embeddings).

The positional scheme is one module shared by all layers; the model calls its hooks (`prepare`
once per forward, then `embed`, and `rotate` with the layer index) and hands it to the attention
kernel (attention.py), which calls the score hooks the scheme needs. Neither asks which scheme
it is.
The training loss fuses the output projection with the cross-entropy, in chunks of tokens
(losses.py), so the (tokens × vocab) logits never exist at once.

Generation may keep a key/value cache (`KVCache`, `new_cache`): each layer's rotated keys, its
values and its decay for the tokens seen so far, so that a new token costs one query over them.
A batch of prompts of unequal length is padded on the left (`left_padding`, as Hugging Face's
generation pads): each sequence's tokens take positions 0, 1, … from its first real token, and
no real token sees a padding key, so each sequence gets what it would get alone.
The new queries attend through the kernel's blockwise reference form (`decoder`), which every
hook serves. A model whose attention of a token depends on more than that token's own position
and the cached keys gets no cache, with the reason (`cache_problem`): a kernel with a running
state (linear), a score hook reading each layer's input (PaTH, GRAPE), a scheme whose treatment
of a token changes with the length (dynamic NTK).
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
class KVCache:
    """What generation keeps between forwards: per layer the keys (as `rotate` left them), the
    values and the decay c (B, H, T) of a decay scheme (FoX), and the positions of those tokens."""

    keys: list[Tensor | None]
    values: list[Tensor | None]
    decays: list[Tensor | None]
    positions: Tensor | None = None  # (T,) or (B, T) [+ (A,)]: the cached tokens' positions
    prepared: Prepared | None = None  # this forward's positions of every token, cached and new
    left_padding: Tensor | None = None  # (B,): padding tokens before each sequence's first
    padded_keys: Tensor | None = None  # this forward's (B, T) True at every padding key
    length: int = 0  # tokens seen (padding included)

    def extend(
        self, layer: int, k: Tensor, v: Tensor, decay: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Every key, value and decay of `layer`, the new tokens' appended (kept for the next
        forward). A decay is a running sum: the new tokens' continues the cached one."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
            if decay is not None:
                cached = self.decays[layer]
                decay = torch.cat([cached, cached[..., -1:] + decay], dim=-1)
        self.keys[layer], self.values[layer], self.decays[layer] = k, v, decay
        return k, v, decay


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
        cache: KVCache | None = None,
    ) -> Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq_len, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        if not kernel.rotates_inside:
            q, k = pos.rotate(q, k, prepared, layer)
        dropout = self.dropout if self.training else 0.0
        decay = pos.data_decay(x, layer)  # a data-dependent bias (FoX), None for most schemes
        if cache is not None:  # new queries over every cached key (GPT.cache_problem: allowed)
            k, v, decay = cache.extend(layer, k, v, decay)
            decoder = kernel.decoder()
            y = decoder.decode(
                q, k, v, pos, cache.prepared, layer, decay, self.sinks, cache.padded_keys
            )
        else:
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
        cache: KVCache | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), prepared, pos, kernel, state, layer, cache)
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

    def hidden_states(
        self,
        idx: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        left_padding: Tensor | None = None,
    ) -> Tensor:
        """Token ids (B, T) and positions ((T,) or (B, T)) -> final normalised states (B, T, d).
        Without positions the scheme gives them: 0..T−1 (randomized in training, if set). A
        multi-axis scheme takes (…, T, A), or token positions (…, T) of text (the same id on
        every axis). With a `cache` (new_cache), `idx` continues the cached tokens, at the
        positions after theirs, and the cache keeps them too. `left_padding` (B,): how many
        tokens of each sequence are padding in front of it (its states are then zeros)."""
        left_padding = self.checked_padding(idx, positions, cache, left_padding)
        if cache is not None:
            return self._cached_hidden_states(idx, cache, left_padding)
        if left_padding is not None:
            # without a cache, each sequence alone: every kernel and scheme, exactly as unpadded
            rows = [
                F.pad(self.hidden_states(row[None, lead:]), (0, 0, lead, 0))
                for row, lead in zip(idx, left_padding.tolist(), strict=True)
            ]
            return torch.cat(rows)
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

    def checked_padding(
        self,
        idx: Tensor,
        positions: Tensor | None,
        cache: KVCache | None,
        left_padding: Tensor | None,
    ) -> Tensor | None:
        """`left_padding` as a (B,) tensor, None where no sequence is padded; a ConfigError for
        a padding the forward cannot take."""
        if left_padding is None:
            return None if cache is None else cache.left_padding
        left_padding = torch.as_tensor(left_padding, device=idx.device)
        batch = idx.shape[0]
        if left_padding.shape != (batch,) or left_padding.is_floating_point():
            raise ConfigError(
                f"left_padding must be {batch} whole numbers, one per sequence, got "
                f"{tuple(left_padding.shape)} of {left_padding.dtype}"
            )
        if positions is not None:
            raise ConfigError("give positions or left_padding, not both")
        if cache is not None and cache.length:  # the padding was set by the first forward
            if cache.left_padding is None and not bool(left_padding.any()):
                return None
            if cache.left_padding is None or not torch.equal(cache.left_padding, left_padding):
                raise ConfigError(
                    "left_padding differs from the one this cache started with; a sequence is "
                    "padded before its first token only"
                )
            return cache.left_padding
        if bool((left_padding < 0).any()) or bool((left_padding >= idx.shape[1]).any()):
            raise ConfigError(
                f"left_padding={left_padding.tolist()}: each sequence needs at least one token "
                f"of its {idx.shape[1]} (0 ≤ padding < {idx.shape[1]})"
            )
        return left_padding if bool(left_padding.any()) else None

    def _cached_hidden_states(
        self, idx: Tensor, cache: KVCache, left_padding: Tensor | None
    ) -> Tensor:
        start, seq_len = cache.length, idx.shape[1]
        positions = torch.arange(start, start + seq_len, device=idx.device)
        cache.left_padding = left_padding
        if left_padding is not None:  # each sequence counts from its first real token
            positions = (positions - left_padding[:, None]).clamp(min=0)
            keys = torch.arange(start + seq_len, device=idx.device)
            cache.padded_keys = keys < left_padding[:, None]
        if self.pos.position_axes:
            positions = self.pos.text_positions(positions)
        if cache.positions is None:
            every = positions
        else:  # a shared (T,) before may meet a padded (B, T) only at the first forward
            token_dim = -2 if self.pos.position_axes else -1
            every = torch.cat([cache.positions, positions], dim=token_dim)
        tokens = self.tok_emb(idx)
        if self.config.scale_embeddings:
            tokens = tokens * math.sqrt(self.config.d_model)
        prepared = self.pos.prepare(positions)  # the new tokens' (embed, rotate)
        cache.prepared = self.pos.prepare(every)  # every token's (the score hooks over the keys)
        x = self.drop(self.pos.embed(tokens, prepared))
        for layer, block in enumerate(self.blocks):
            x = block(x, prepared, self.pos, self.attention, None, layer, cache)
        cache.positions, cache.prepared, cache.padded_keys = every, None, None
        cache.length += seq_len
        return self.ln_f(x)

    def cache_problem(self) -> str | None:
        """Why generation cannot keep a key/value cache for this model (None: it can)."""
        if self.attention.rotates_inside or self.attention.decoder() is None:
            return (
                f"attention={self.attention.name} computes another function than softmax "
                "over the keys (a running state), which the cache does not keep"
            )
        if self.pos.reads_length:
            return (
                f"pos={type(self.pos).__name__} treats a token by the forward's length, not only "
                "by its own position (reads_length), so cached keys would go stale"
            )
        x = torch.randn(1, 2, self.config.d_model, generator=torch.Generator().manual_seed(0))
        device = self.tok_emb.weight.device
        x = x.to(device)
        if any(self.pos.layer_data(x, layer) is not None for layer in range(self.config.n_layer)):
            return (
                f"pos={type(self.pos).__name__}'s score hook reads each layer's input "
                "(layer_data), which the cache does not keep"
            )
        if not self._positions_are_local(device):
            return (
                f"pos={type(self.pos).__name__} treats a token by more than its own position "
                "(e.g. by the sequence's length), so cached keys would go stale"
            )
        return None

    @torch.no_grad()
    def _positions_are_local(self, device: torch.device) -> bool:
        """Whether tokens embedded and rotated a chunk at a time (as generation with a cache
        sees them: 0..3, then 4..5, then 6..11) give the embeddings and the q·k scores of the
        12 tokens taken at once (xPos scales q and k by the length, which cancels in q·k); fewer
        tokens where the scheme represents fewer positions (a short learned table)."""
        generator = torch.Generator().manual_seed(0)
        d, h = self.config.d_model, self.config.n_head
        n = 12
        while n > 3:  # fewer where the scheme represents fewer (a learned table of 8 rows)
            try:
                self.pos.check_length(n - 1)
                break
            except ConfigError:
                n -= 1
        x = torch.randn(1, n, d, generator=generator).to(device)
        q, k = torch.randn(2, 1, h, n, d // h, generator=generator).to(device)

        def hooks(start: int, end: int) -> list[list[Tensor]]:
            positions = torch.arange(start, end, device=device)
            if self.pos.position_axes:
                positions = self.pos.text_positions(positions)
            prepared = self.pos.prepare(positions)
            rows = [self.pos.embed(x[:, start:end], prepared)]
            for layer in range(self.config.n_layer):
                q_rot, k_rot = self.pos.rotate(
                    q[:, :, start:end], k[:, :, start:end], prepared, layer
                )
                rows += [q_rot, k_rot]
            return rows

        bounds = (0, n // 3, n // 2, n)  # 0..3, 4..5, 6..11 for 12 tokens
        chunks = [hooks(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
        pieces = [torch.cat(parts, dim=-2) for parts in zip(*chunks, strict=True)]
        whole = hooks(0, n)
        same = torch.allclose(pieces[0], whole[0], rtol=1e-5, atol=1e-6)
        for i in range(1, len(whole), 2):  # each layer's scores q·k
            scores = pieces[i] @ pieces[i + 1].transpose(-1, -2)
            same = same and torch.allclose(
                scores, whole[i] @ whole[i + 1].transpose(-1, -2), rtol=1e-5, atol=1e-5
            )
        return same

    def new_cache(self) -> KVCache:
        """An empty key/value cache for generation (`forward(idx, cache=...)`); a ConfigError
        with the reason where this model cannot keep one (`cache_problem`)."""
        problem = self.cache_problem()
        if problem:
            raise ConfigError(f"no key/value cache: {problem}; generate without one")
        n = self.config.n_layer
        return KVCache([None] * n, [None] * n, [None] * n)

    def forward(
        self,
        idx: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        left_padding: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, T, vocab) (`hidden_states` says what each argument is)."""
        return self.lm_head(self.hidden_states(idx, positions, cache, left_padding))

    def loss(self, idx: Tensor, targets: Tensor, positions: Tensor | None = None) -> Tensor:
        """Mean next-token cross-entropy (targets of -100 are ignored), fused with the output
        projection so that the logits are never materialised."""
        hidden = self.hidden_states(idx, positions)
        return linear_cross_entropy(hidden, self.lm_head.weight, targets)

    def num_parameters(self, non_embedding: bool = True) -> int:
        total = sum(p.numel() for p in self.parameters())
        return total - self.tok_emb.weight.numel() if non_embedding else total
