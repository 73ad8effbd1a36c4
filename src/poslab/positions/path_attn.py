"""PaTH attention (Yang et al., NeurIPS 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations", arXiv 2505.16381): RoPE's fixed rotations replaced
by a data-dependent product of Householder-like transforms along the path from key to query.

Each token t of each head gives a unit vector w_t and a β_t ∈ (0, 2), and with them the
transform H_t = I − β_t w_t w_tᵀ. Query i scores key j ≤ i as

    s(i, j) = q_iᵀ H_i H_{i−1} ⋯ H_{j+1} k_j / √d,

so what lies between key and query sets how the key is seen (the empty product on the
diagonal: s(i, i) = q_i·k_i / √d). β < 1 shrinks, β > 1 reflects (negative eigenvalues), and
β = 0 everywhere is NoPE. No positions are read: order enters through the product alone, so
shifting every position changes nothing. The layer's normalised input x gives w and β, as in
the reference layer (fla-org/flash-linear-attention, fla/layers/path_attn.py): w from a
low-rank projection x → `rank` → d_model (a full one with rank=null), a causal depthwise
convolution of `conv_size` taps with SiLU (none with conv_size=null), then an L2 norm per head;
β = 2σ(x·u_h + b_h) per head. Weights start normal with std 0.02, biases at 0, as the
reference's `_init_weights` (β then starts near 1).

The scores are computed exactly, in fp32, in chunks of `chunk_size` tokens with the compact WY
form of a chunk's product (each chunk's H_last ⋯ H_first = I − Wᵀ U, U = (I + L)⁻¹ diag(β) W,
L the strictly lower part of diag(β) W Wᵀ: one triangular solve); a key is carried to its
chunk's end and a query back to its chunk's start inside the chunk, and across chunks the
queries pass through whole chunks' products, one step per chunk of distance. This is the
algorithm of the reference's naive op (fla/ops/path_attn/naive.py), written from the paper's
definition here; the tests check it against the product taken one transform at a time in
float64, and against the reference's decoding rule (every cached key times H_t as token t
arrives). Memory is that of the score block; time O(T²·d + (T/C)²·C·d²).

On a GPU where fla is installed, `attend` runs fla's fused Triton kernel (`parallel_path_attn`)
instead, with the same w and β, whenever nothing else enters the scores (no window, sinks,
decay or dropout); a CPU, or a GPU without fla, uses the chunked path above. Needs the scores,
so it runs on the blockwise kernel (attention=auto picks it). What this module leaves out: the
reference's optional forget gate (PaTH-FoX) and grouped key heads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import integer, require
from poslab.positions.base import PositionalScheme

INIT_STD = 0.02  # the reference's initializer_range for every Linear and Conv1d
FLA_HEAD_DIMS = (16, 32, 64, 128)  # what fla's kernel takes


@functools.cache
def fla_kernel() -> Callable | None:
    """fla's fused PaTH kernel, or None where fla (or Triton) is not installed."""
    try:
        from fla.ops.path_attn import parallel_path_attn
    except Exception:  # an ImportError, or Triton failing to load on this machine
        return None
    return parallel_path_attn


class PaTH(PositionalScheme):
    needs = "scores"
    reads_positions: ClassVar[bool] = False
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        rank: int | None = 32,
        conv_size: int | None = 3,
        chunk_size: int = 64,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.rank", rank, integer(1, null=True))
        require("pos.conv_size", conv_size, integer(1, null=True))
        require("pos.chunk_size", chunk_size, integer(1))
        self.rank, self.conv_size, self.chunk_size = rank, conv_size, chunk_size
        self.per_layer = True  # each layer its own projections, as the reference's layers
        layers = self.n_layer

        def normal(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(layers, *shape) * INIT_STD)

        # one tensor per kind for all layers: a layer a schedule gives to another scheme still
        # gets a zero gradient, as DDP expects
        self.w_down = normal(rank, d_model) if rank is not None else None
        self.w_up = normal(d_model, rank if rank is not None else d_model)
        self.w_conv = normal(d_model, conv_size) if conv_size is not None else None
        self.beta_weight = normal(n_head, d_model)
        self.beta_bias = nn.Parameter(torch.zeros(layers, n_head))

    # -- what each token gives -------------------------------------------------------------------

    def layer_data(self, x: Tensor, layer: int = 0) -> tuple[Tensor, Tensor]:
        """w (B, H, T, d), unit per head, and β (B, H, T) ∈ (0, 2), fp32, from the layer's
        normalised input x (B, T, d_model)."""
        batch, seq_len, _ = x.shape
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.float()
            h = x if self.w_down is None else x @ self.w_down[layer].float().T
            h = h @ self.w_up[layer].float().T  # (B, T, d_model)
            if self.w_conv is not None:  # causal: token t sees t − K + 1 .. t
                taps = self.w_conv[layer].float()[:, None, :]  # (d_model, 1, K)
                h = F.pad(h.transpose(1, 2), (taps.shape[-1] - 1, 0))
                h = F.silu(F.conv1d(h, taps, groups=taps.shape[0])).transpose(1, 2)
            w = h.view(batch, seq_len, self.n_head, self.head_dim).transpose(1, 2)
            w = w * torch.rsqrt(w.square().sum(-1, keepdim=True) + 1e-6)  # fla's l2_norm
            logits = F.linear(x, self.beta_weight[layer].float(), self.beta_bias[layer].float())
            beta = 2 * torch.sigmoid(logits).transpose(1, 2)  # (B, H, T)
        return w, beta

    # -- the scores --------------------------------------------------------------------------------

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
        """The PaTH scores of a block of queries (the last Tq of the Tk tokens) over keys
        0..Tk−1; the plain q·k scores handed in are replaced (same scale, 1/√d)."""
        if data is None:
            raise ValueError("PaTH's scores need the layer's w and β (layer_data)")
        w, beta = data
        end = k.shape[-2]
        with torch.autocast(device_type=scores.device.type, enabled=False):
            raw = path_scores(
                q.float(), k.float(), w[..., :end, :], beta[..., :end], self.chunk_size
            )
            return (raw * q.shape[-1] ** -0.5).masked_fill(future, 0.0)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, data: Any, layer: int = 0) -> Tensor | None:
        """fla's fused kernel on a GPU where it is installed (same w, β and scale), else None."""
        kernel = fla_kernel() if q.is_cuda else None
        if kernel is None or data is None or q.shape[-1] not in FLA_HEAD_DIMS:
            return None
        w, beta = data
        heads_second = (t.transpose(1, 2) for t in (q, k, v, w))  # fla's (B, T, H, d)
        q_, k_, v_, w_ = (t.contiguous() for t in heads_second)
        out, _ = kernel(q=q_, k=k_, v=v_, w=w_, beta=beta.transpose(1, 2).contiguous())
        return out.transpose(1, 2)

    def metrics(self) -> dict[str, Tensor]:
        """β's bias per layer: where the transforms sit between shrinking (β < 1) and
        reflecting (β > 1) for an input orthogonal to u."""
        values = 2 * torch.sigmoid(self.beta_bias.detach().float())
        return {f"path_beta0_layer{i}": values[i].mean() for i in range(values.shape[0])}


def chunk_transforms(
    w: Tensor, beta: Tensor, k: Tensor, q: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Per chunk (…, n, C, ·): U (its product is I − Wᵀ U), the keys carried to the chunk's
    end, the queries carried back to its start, and the in-chunk scores (valid for s ≤ t)."""
    size = w.shape[-2]
    strict = torch.ones(size, size, dtype=torch.bool, device=w.device).tril(-1)
    lower = torch.ones(size, size, dtype=torch.bool, device=w.device).tril()
    wb = w * beta[..., None]  # rows β_r w_r
    unit = torch.eye(size, dtype=w.dtype, device=w.device)
    # (I + L)⁻¹, L[r, u] = β_r w_r·w_u for u < r: the coefficients of the product's WY form
    inverse = torch.linalg.solve_triangular(
        unit + (wb @ w.transpose(-1, -2)) * strict, unit, upper=False, unitriangular=True
    )
    u = inverse @ wb
    a = inverse @ ((wb @ k.transpose(-1, -2)) * strict)  # a[r, s]: key s's step r, r > s
    keys = k - a.transpose(-1, -2) @ w  # H_last ⋯ H_{s+1} k_s
    qw = (q @ w.transpose(-1, -2)) * lower  # q_t·w_r for r ≤ t
    queries = q - qw @ u  # (H_first ⋯ H_t q_t): the row q_tᵀ H_t ⋯ H_first
    local = q @ k.transpose(-1, -2) - qw @ a  # q_tᵀ H_t ⋯ H_{s+1} k_s
    return u, keys, queries, local, lower


def path_scores(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk_size: int = 64) -> Tensor:
    """q_iᵀ H_i ⋯ H_{j+1} k_j (B, H, Tq, Tk), unscaled, for queries q (B, H, Tq, d), the last
    Tq of the Tk tokens, over keys k (B, H, Tk, d), with w (B, H, Tk, d) and β (B, H, Tk);
    entries of keys after their query are 0. Exact: the WY form within chunks of
    `chunk_size`, whole chunks' products between them."""
    tq, tk, size = q.shape[-2], k.shape[-2], chunk_size
    start, n = tk - tq, -(-tk // size)
    pad = n * size - tk
    # padding tokens carry β = 0 (H = I) and zero keys and queries: they change nothing
    chunked = [
        F.pad(t, (0, 0, before, pad)).unflatten(-2, (n, size))
        for t, before in ((q, start), (k, 0), (w, 0))
    ]
    q_c, k_c, w_c = chunked
    beta_c = F.pad(beta, (0, pad)).unflatten(-1, (n, size))
    u, keys, queries, local, lower = chunk_transforms(w_c, beta_c, k_c, q_c)
    first = start // size  # the first chunk that holds a query
    blocks: dict[tuple[int, int], Tensor] = {
        (i, i): local[..., i, :, :] * lower for i in range(first, n)
    }
    carried, base = queries[..., first:, :, :], first
    for distance in range(1, n):
        low = max(first, distance)  # query chunks with a chunk `distance` before them
        if low >= n:
            break
        carried, base = carried[..., low - base :, :, :], low
        seen = slice(low - distance, n - distance)
        scored = carried @ keys[..., seen, :, :].transpose(-1, -2)  # (…, n − low, C, C)
        for offset, block in enumerate(scored.unbind(-3)):
            blocks[(low + offset, low + offset - distance)] = block
        wj, uj = w_c[..., seen, :, :], u[..., seen, :, :]
        carried = carried - (carried @ wj.transpose(-1, -2)) @ uj  # on through chunk j
    zeros = local.new_zeros(*local.shape[:-3], size, size)
    rows = [
        torch.cat([blocks.get((i, j), zeros) for j in range(n)], dim=-1) for i in range(first, n)
    ]
    table = torch.cat(rows, dim=-2)  # queries of chunks first..n−1 over every key
    skip = start - first * size
    return table[..., skip : skip + tq, :tk]
