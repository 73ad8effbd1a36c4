"""Output projection and cross-entropy fused, in chunks of tokens.

A language model's logits are a (tokens × vocab) matrix: 272 MB in fp32 for one 32×64 batch with
WikiText-2's 33k words, plus its `.float()` copy, its softmax and their gradients. Here the logits
of at most `chunk` tokens exist at a time. In training the gradients are computed during the
forward pass (chunk by chunk: softmax − one-hot, then the two matmuls of the projection's
backward), so nothing of size vocab is kept for the backward pass; the matmul FLOPs are the same
as projecting and differentiating the whole matrix at once.

Matmuls run in the autocast dtype when autocast is on (bf16 where it is native); log-sum-exp,
the loss and the accumulated weight gradient are fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.model.precision import compute_dtype
from poslab.targets import IGNORE_INDEX

# logits of at most ~16 MB in fp32 at a time: large enough for efficient matmuls, small enough to
# stay in the last-level cache of a CPU and to never matter for GPU memory
CHUNK_ELEMENTS = 1 << 22


def default_chunk(vocab_size: int) -> int:
    return max(64, CHUNK_ELEMENTS // vocab_size)


def _exp_and_lse(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One in-place pass over a chunk of logits: shift by the row max, exponentiate, sum.
    Returns (the exponentials, their row sums, log-sum-exp); `logits` is overwritten, and the
    exponentials are the softmax numerators the gradient needs."""
    row_max = logits.amax(dim=-1, keepdim=True)
    exps = logits.sub_(row_max).exp_()
    total = exps.sum(dim=-1, keepdim=True)
    return exps, total, (total.log() + row_max).squeeze(1)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, dtype):  # type: ignore[override]
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        ctx.weight_dtype = weight.dtype
        valid = targets != IGNORE_INDEX
        count = valid.sum().clamp(min=1)
        # fp32 at least for everything summed (fp64 stays fp64: the tests compare exactly)
        acc = torch.promote_types(weight.dtype, torch.float32)
        w = weight.to(dtype)
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=acc) if needs_grad else None
        # one buffer each for the chunk's logits (fp32 and compute dtype) and the weight
        # gradient's chunk, reused by every chunk: a fresh 16 MB tensor per chunk costs more in
        # page faults than the copy into it (a CPU's allocator hands such sizes back at free)
        rows_max = min(chunk, hidden.shape[0])
        logits_buffer = torch.empty(rows_max, w.shape[0], dtype=acc, device=hidden.device)
        low_buffer = (
            None if dtype == acc else logits_buffer.new_empty(logits_buffer.shape, dtype=dtype)
        )
        weight_buffer = None if dtype == acc or not needs_grad else torch.empty_like(w)
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk].to(dtype)
            t = targets[start : start + chunk]
            v = valid[start : start + chunk]
            safe_t = t.clamp(min=0)
            logits = logits_buffer[: len(t)]
            if low_buffer is None:
                torch.mm(h, w.T, out=logits)
            else:
                logits.copy_(torch.mm(h, w.T, out=low_buffer[: len(t)]))
            target_logit = logits.gather(1, safe_t[:, None]).squeeze(1)
            exps, total, lse = _exp_and_lse(logits)
            loss += ((lse - target_logit) * v).sum()
            if not needs_grad:
                continue
            # d loss / d logits = (softmax − one-hot) / count, zero on ignored tokens
            row_weight = v.to(acc) / count
            grad_logits = exps.mul_(row_weight[:, None] / total)
            rows = torch.arange(len(t), device=t.device)
            grad_logits[rows, safe_t] -= row_weight
            g = grad_logits if low_buffer is None else low_buffer[: len(t)].copy_(grad_logits)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk] = (g @ w).to(hidden.dtype)
            if weight_buffer is None:
                grad_weight.addmm_(g.T, h)
            else:
                grad_weight += torch.mm(g.T, h, out=weight_buffer)
        if needs_grad:
            ctx.save_for_backward(
                grad_hidden if grad_hidden is not None else torch.empty(0), grad_weight
            )
        return loss / count

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_output if ctx.needs_input_grad[0] else None
        gw = (grad_weight * grad_output).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int | None = None
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T` (hidden (..., d), weight (V, d), targets (...)),
    ignoring targets equal to -100, without materialising the (tokens × V) logits."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    dtype = compute_dtype(hidden.dtype, hidden.device.type)
    chunk = chunk or default_chunk(weight.shape[0])
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, dtype)


@torch.no_grad()
def linear_token_nll(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int | None = None
) -> Tensor:
    """Per-token negative log-likelihood (fp32, shape of `targets`) of `hidden @ weight.T`,
    computed in chunks of tokens (for evaluation: no gradients)."""
    shape = targets.shape
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    dtype = compute_dtype(hidden.dtype, hidden.device.type)
    chunk = chunk or default_chunk(weight.shape[0])
    w = weight.to(dtype)
    nll = torch.empty(targets.shape, dtype=torch.float32, device=hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, hidden.shape[0], chunk):
            logits = (hidden[start : start + chunk].to(dtype) @ w.T).float()
            t = targets[start : start + chunk]
            target_logit = logits.gather(1, t[:, None]).squeeze(1)
            nll[start : start + chunk] = _exp_and_lse(logits)[2] - target_logit
    return nll.view(shape)
