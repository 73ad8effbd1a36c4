"""The one interface every positional scheme implements.

A scheme can act in three places, and the model calls all three hooks for every scheme:

1. ``embed``: add a vector to the token embeddings (learned, sinusoidal);
2. ``rotate``: transform queries and keys given their positions (rotary, xPos);
3. ``attention_bias``: a bias added to the attention scores as a function of query and key
   positions (ALiBi, T5, KERPLE, FIRE). Schemes that use it set ``has_attention_bias = True``
   so the attention kernel knows, before any work, that it must take the bias-aware path.

Positions are explicit 1-D integer tensors (one position per token), so an offset or a long
evaluation needs no special code. Every hook computes positions, angles and distances in fp32
whatever the autocast dtype: bf16 cannot represent every integer above 256.

Work that depends on the positions alone (fp32 positions, rotary cos/sin) is done once per forward
by ``prepare``; the model hands its result to the hooks of every layer. The hooks also accept raw
positions (they prepare them themselves), which is convenient in tests and notebooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class Prepared:
    """What the hooks of one forward need, computed once, not once per layer."""

    positions: Tensor  # (T,) as given
    fp32: Tensor  # (T,) float32, computed outside autocast
    extra: dict[str, Any] = field(default_factory=dict)  # the scheme's own (rotary cos/sin)


class PositionalScheme(nn.Module):
    """Base class: the identity for all three hooks (which is exactly the `nope` scheme)."""

    has_attention_bias: bool = False

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head

    def prepare(self, positions: Tensor) -> Prepared:
        """Positions (T,) -> what the hooks need; schemes extend it (rotary adds cos/sin)."""
        return Prepared(positions, fp32_positions(positions))

    def prepared(self, positions: Tensor | Prepared) -> Prepared:
        return positions if isinstance(positions, Prepared) else self.prepare(positions)

    def embed(self, x: Tensor, positions: Tensor | Prepared) -> Tensor:
        """Token embeddings (B, T, d_model) -> embeddings with position added."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | Prepared) -> tuple[Tensor, Tensor]:
        """Queries and keys (B, H, T, head_dim) -> transformed queries and keys."""
        return q, k

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Additive score bias (H, Tq, Tk) in fp32 for positions (Tq,) and (Tk,) (integer or
        fp32), built from `score_bias`. Only called when has_attention_bias."""
        with torch.autocast(device_type=q_positions.device.type, enabled=False):
            heads = torch.arange(self.n_head, device=q_positions.device)
            q = fp32_positions(q_positions)
            k = fp32_positions(k_positions)
            return self.score_bias(heads[:, None, None], q[None, :, None], k[None, None, :])

    def score_bias(self, head: Tensor, q_position: Tensor, k_position: Tensor) -> Tensor:
        """The bias of a scheme with has_attention_bias, elementwise for broadcastable integer
        head and fp32 position tensors: one definition serves the blockwise kernel (through
        `attention_bias`) and FlexAttention's `score_mod`, which calls it with scalars."""
        raise NotImplementedError(f"{type(self).__name__} adds no attention bias")

    def check_length(self, max_position: int) -> None:
        """Raise ConfigError if this scheme cannot represent positions up to `max_position`."""

    def metrics(self) -> dict[str, Tensor]:
        """Scalars worth logging during training (e.g. how far a learnable θ moved)."""
        return {}


def fp32_positions(positions: Tensor) -> Tensor:
    """Positions as fp32, outside autocast (exact for integers below 2**24)."""
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return positions.to(torch.float32)
