"""The one interface every positional scheme implements.

A scheme can act in three places, and the model calls all three hooks for every scheme:

1. ``embed``: add a vector to the token embeddings (learned, sinusoidal);
2. ``rotate``: transform queries and keys given their positions (rotary, xPos);
3. ``attention_bias``: a bias added to the attention scores as a function of query and key
   positions (ALiBi, T5, KERPLE, FIRE). Schemes that use it set ``has_attention_bias = True``
   so the attention kernel knows, before any work, that it must take the bias-aware path.

Positions are explicit 1-D integer tensors (one position per token), so an offset, a long
evaluation or packed sequences need no special code. Every hook computes positions, angles and
distances in fp32 whatever the autocast dtype: bf16 cannot represent every integer above 256.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionalScheme(nn.Module):
    """Base class: the identity for all three hooks (which is exactly the `nope` scheme)."""

    has_attention_bias: bool = False

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Token embeddings (B, T, d_model) -> embeddings with position added."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys (B, H, T, head_dim) -> transformed queries and keys."""
        return q, k

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Additive score bias (H, Tq, Tk) in fp32. Only called when has_attention_bias."""
        raise NotImplementedError(f"{type(self).__name__} adds no attention bias")

    def check_length(self, max_position: int) -> None:
        """Raise ConfigError if this scheme cannot represent positions up to `max_position`."""

    def metrics(self) -> dict[str, Tensor]:
        """Scalars worth logging during training (e.g. how far a learnable θ moved)."""
        return {}


def relative_distance(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """(Tq, Tk) fp32 matrix of q_pos - k_pos: positive for keys in the past."""
    return q_positions.float()[:, None] - k_positions.float()[None, :]


def fp32_positions(positions: Tensor) -> Tensor:
    """Positions as fp32, outside autocast (exact for integers below 2**24)."""
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return positions.to(torch.float32)
