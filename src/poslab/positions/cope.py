"""CoPE (Golovneva et al. 2024, "Contextual Position Encoding"): positions counted by the
content. Each query m gates every earlier key j with g_mj = σ(q_m·k_j); the position of key n
seen from m is the number of gated keys between them,

    p_mn = Σ_{j=n..m} g_mj        (fractional; non-decreasing as n moves back; ≤ m − n + 1),

and a learned vector e[p] per integer position (shared by the heads; `npos` of them, positions
beyond clamped to the last) is interpolated at p_mn and added to the score: q_m·e[p_mn],
computed as z_m[k] = q_m·e[k] for integer k, then interpolated linearly. Reference:
lucidrains/x-transformers `CoPE`. The gates use the scaled scores q·k/√d and only keys j ≤ m.

CoPE needs the queries and the scores, so it runs with attention=blockwise.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from poslab.checks import integer, require
from poslab.positions.base import PositionalScheme


class CoPE(PositionalScheme):
    needs = "scores"
    reads_positions = False  # positions come from the content, not from the token index
    shift_invariant: ClassVar[bool] = True

    def __init__(self, d_model: int, n_head: int, npos: int = 64, **common: Any) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.npos", npos, integer(2))
        self.npos = npos
        self.pos_emb = nn.Parameter(torch.zeros(npos, self.head_dim))

    def positions_from_scores(self, scores: Tensor, future: Tensor) -> Tensor:
        """p_mn = Σ_{j=n..m} σ(score_mj) over the keys j ≤ m (future keys gate nothing)."""
        gates = torch.sigmoid(scores).masked_fill(future, 0.0)
        return gates.flip(-1).cumsum(-1).flip(-1)

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
        logits = q.float() @ self.pos_emb.float().t()  # (B, H, Tq, npos): q·e[k]
        return ContextualScores.apply(scores, logits.to(scores.dtype), future)


class ContextualScores(torch.autograd.Function):
    """scores + z[p] for scores (B, H, Tq, Tk), z = q·e (B, H, Tq, npos) and `future`, True for
    the keys a query may not see (broadcastable to the scores), with p = Σ_{j=n..m} σ(score_mj)
    over the keys it sees (whatever the scores hold elsewhere, a −inf or a NaN included),
    clamped to npos − 1, and z interpolated linearly:

        z[p] = z[⌊p⌋] + (p − ⌊p⌋)·(z[⌊p⌋ + 1] − z[⌊p⌋])

    The same function autograd would differentiate, with a backward written out: autograd's own
    took 2–3× the forward (a flip and a cumsum in each direction, gathers indexed by int64,
    whose conversion from float alone cost more than the gathers). Here the table is indexed by
    one int32 offset per pair into the flat z, and the gradient of p runs back as one cumsum:

        ∂L/∂p_n = G_n·(z[i_n + 1] − z[i_n])    (0 where p is clamped: the last step is 0)
        ∂L/∂g_j = Σ_{n ≤ j} ∂L/∂p_n            (p_n sums the gates from n on)
    """

    @staticmethod
    def forward(ctx: Any, scores: Tensor, logits: Tensor, future: Tensor) -> Tensor:  # noqa: D102
        npos = logits.shape[-1]
        gates = torch.sigmoid(scores).masked_fill_(future, 0.0)
        frac = gates.flip(-1).cumsum_(-1).flip(-1).clamp_(max=npos - 1)
        floor = frac.floor()
        frac.sub_(floor)
        # z[i + 1] − z[i], the last 0: p ≤ npos − 1 never reaches past the table
        steps = torch.nn.functional.pad(logits.diff(dim=-1), (0, 1))
        offsets = _flat_offsets(floor, logits)
        low = logits.reshape(-1).index_select(0, offsets).view_as(scores)
        step = steps.reshape(-1).index_select(0, offsets).view_as(scores)
        ctx.save_for_backward(gates, frac, offsets, step)
        ctx.logits_shape = logits.shape
        return low.add_(scores).addcmul_(frac, step)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # noqa: D102
        gates, frac, offsets, step = ctx.saved_tensors
        grad = grad.contiguous()
        # through the positions into the gates (0 for unseen keys: their gate is 0 there)
        grad_gates = (grad * step).cumsum_(-1)
        grad_scores = torch.ops.aten.sigmoid_backward(grad_gates, gates).add_(grad)
        # through the table: z[i] takes G·(1 − f), z[i + 1] takes G·f
        table = ctx.logits_shape.numel()
        at_low = grad.new_zeros(table).index_add_(0, offsets, grad.reshape(-1))
        at_step = grad.new_zeros(table).index_add_(0, offsets, (grad * frac).reshape(-1))
        grad_logits = at_low.view(ctx.logits_shape)
        at_step = at_step.view(ctx.logits_shape)[..., :-1]  # the last step is the constant 0
        grad_logits[..., :-1] -= at_step
        grad_logits[..., 1:] += at_step
        return grad_scores, grad_logits, None


def _flat_offsets(floor: Tensor, logits: Tensor) -> Tensor:
    """The flat index into `logits` (B, H, Tq, npos) of z[⌊p⌋] for every pair (0 ≤ ⌊p⌋ ≤
    npos − 1): int32 where it fits (a float32 → int32 conversion by the 1.5·2²³ trick, exact for
    integers below 2²²), which index_select and index_add_ take; int64 beyond."""
    rows, npos = logits.shape[:-1].numel(), logits.shape[-1]
    if rows * npos < 2**31 and npos <= 2**22 and floor.dtype == torch.float32:
        index = (floor + _MAGIC).view(torch.int32).sub_(_MAGIC_BITS)
        dtype = torch.int32
    else:
        index, dtype = floor.long(), torch.long
    base = torch.arange(rows, device=floor.device, dtype=dtype).mul_(npos)
    return index.add_(base.view(*logits.shape[:-1], 1)).reshape(-1)


# x + 1.5·2²³ puts an integer 0 ≤ x < 2²² in the low mantissa bits of a float32
_MAGIC = 12582912.0
_MAGIC_BITS = 0x4B400000
