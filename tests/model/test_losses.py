"""The fused, chunked output projection + cross-entropy equals the plain computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from poslab.model.losses import IGNORE_INDEX, linear_cross_entropy, linear_token_nll


def _data(n: int = 50, d: int = 16, vocab: int = 37, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_()
    weight = (0.3 * torch.randn(vocab, d, generator=g, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 7, 50, 1000])
def test_loss_and_gradients_match_plain_cross_entropy(chunk):
    hidden, weight, targets = _data()
    targets[[3, 10, 11]] = IGNORE_INDEX  # ignored tokens count neither in the sum nor the mean
    ref = F.cross_entropy(hidden @ weight.T, targets, ignore_index=IGNORE_INDEX)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    out = linear_cross_entropy(hidden, weight, targets, chunk=chunk)
    grads = torch.autograd.grad(out, (hidden, weight))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_gradient_scales_with_upstream_gradient():
    hidden, weight, targets = _data()
    (g1,) = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets), hidden)
    (g3,) = torch.autograd.grad(3.0 * linear_cross_entropy(hidden, weight, targets), hidden)
    torch.testing.assert_close(g3, 3.0 * g1)


def test_batched_shapes_and_tied_weights_accumulate_gradients():
    # (B, T, d) hidden states and a weight also used elsewhere, as the tied embedding is
    torch.manual_seed(1)
    emb = torch.nn.Embedding(37, 16, dtype=torch.float64)
    idx = torch.randint(0, 37, (3, 9))
    targets = torch.randint(0, 37, (3, 9))
    hidden = torch.tanh(emb(idx))
    ref = F.cross_entropy((hidden @ emb.weight.T).flatten(0, 1), targets.flatten())
    (ref_grad,) = torch.autograd.grad(ref, emb.weight)
    out = linear_cross_entropy(torch.tanh(emb(idx)), emb.weight, targets, chunk=5)
    (grad,) = torch.autograd.grad(out, emb.weight)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-9)


def test_token_nll_matches_per_token_cross_entropy():
    hidden, weight, targets = _data()
    ref = F.cross_entropy(hidden @ weight.T, targets, reduction="none")
    nll = linear_token_nll(hidden.view(5, 10, -1), weight, targets.view(5, 10), chunk=6)
    assert nll.shape == (5, 10) and nll.dtype == torch.float32
    torch.testing.assert_close(nll.flatten(), ref.float(), rtol=1e-6, atol=1e-6)


def test_bf16_autocast_stays_close_to_fp32():
    hidden, weight, targets = _data(n=64, d=32, vocab=101)
    h, w = hidden.detach().float(), weight.detach().float()
    ref = linear_cross_entropy(h, w, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = linear_cross_entropy(h, w, targets)
    assert low.dtype == torch.float32  # the loss itself is accumulated in fp32
    assert abs(low.item() - ref.item()) / ref.item() < 1e-2


def test_no_gradient_work_without_grad():
    hidden, weight, targets = _data()
    with torch.no_grad():
        out = linear_cross_entropy(hidden, weight, targets)
    assert out.grad_fn is None
    ref = F.cross_entropy(hidden @ weight.T, targets)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-6, atol=1e-6)
