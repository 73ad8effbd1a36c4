"""The CUDA paths of the 2024–25 methods, where CUDA exists (skipped on a CPU): FoX's decay and
sliding windows through SDPA's mask gradient and compiled FlexAttention's captured tensors,
checked against the blockwise reference in fp32, forward and backward. Not yet run on a GPU
(README: which CUDA paths have run)."""

from __future__ import annotations

import pytest
import torch
from models import tiny_gpt, tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _logits_and_gradients(scheme, kernel, kernel_options, **scheme_options):
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options).cuda()
    model.train()
    idx = tokens(2, 128).cuda()  # a multiple of FlexAttention's 128-token blocks
    logits = model(idx)
    logits.float().square().mean().backward()
    grads = {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if n.startswith("pos.")
    }
    return logits.detach(), grads


@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
@pytest.mark.parametrize(
    ("scheme", "scheme_options", "window"),
    [
        ("fox", {}, None),
        ("fox", {}, 16),
        ("alibi", {}, 16),
        ("schedule", {"layers": ["alibi", "fox"]}, None),
    ],
)
def test_cuda_kernels_equal_the_reference_forward_and_backward(
    kernel, scheme, scheme_options, window
):
    reference = _logits_and_gradients(scheme, "blockwise", {"window": window}, **scheme_options)
    logits, grads = _logits_and_gradients(scheme, kernel, {"window": window}, **scheme_options)
    torch.testing.assert_close(logits, reference[0], atol=1e-4, rtol=1e-4)
    assert grads.keys() == reference[1].keys()
    for name, grad in grads.items():  # FoX's gates learn through the mask / score_mod
        torch.testing.assert_close(grad, reference[1][name], atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize(
    ("scheme", "scheme_options"),
    [
        ("alibi", {"learnable_slopes": True}),
        ("t5", {"per_layer": True}),
        ("kerple", {"variant": "power"}),
        ("fire", {}),
        ("schedule", {"layers": ["t5", "kerple"]}),
    ],
)
def test_compiled_flex_learns_every_learnable_bias(scheme, scheme_options):
    """Compiled FlexAttention's backward takes a captured tensor's gradient only where the
    score_mod indexes it once, directly (t5's table selected by layer inside it failed to compile
    on the first GPU run): every learnable bias reaches it in that form, or as a dense table,
    and its gradients equal the reference kernel's."""
    reference = _logits_and_gradients(scheme, "blockwise", {}, **scheme_options)
    logits, grads = _logits_and_gradients(scheme, "flex", {}, **scheme_options)
    torch.testing.assert_close(logits, reference[0], atol=1e-4, rtol=1e-4)
    assert grads and grads.keys() == reference[1].keys()
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name  # the bias learns through the kernel
        torch.testing.assert_close(grad, reference[1][name], atol=1e-4, rtol=1e-3, msg=name)


def test_stick_breaking_trains_on_cuda_in_bf16():
    model = tiny_gpt("nope", "stick_breaking").cuda()
    model.train()
    idx = tokens(2, 64).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
