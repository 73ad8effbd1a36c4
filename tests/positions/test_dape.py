"""positions/dape.py: DAPE's scores + bias + MLP([scores; bias]), against the formula in float64,
against the reference implementation's code, per-sequence positions, gradients, NaN safety and
its options' errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from models import tiny_gpt, tokens
from torch import nn

from poslab.errors import ConfigError
from poslab.model.attention import masked_keys
from poslab.positions import build_scheme
from poslab.positions.alibi import alibi_slopes
from poslab.positions.dape import DAPE, PairMLP

D_MODEL, N_HEAD, N_LAYER, T = 32, 4, 2, 7


def _future(tq: int, tk: int, start: int = 0) -> torch.Tensor:
    return torch.arange(tk)[None, :] > torch.arange(start, start + tq)[:, None]


def _scheme(bias: str = "kerple", seed: int = 0, **options) -> DAPE:
    torch.manual_seed(seed)
    return DAPE(D_MODEL, N_HEAD, n_layer=N_LAYER, bias=bias, **options)


def _mlp64(x: torch.Tensor, scheme: DAPE, layer: int) -> torch.Tensor:
    """f(x) = W2·LeakyReLU(W1·x + b1) + b2 by hand, float64, for x (..., 2H) -> (..., H)."""
    i = scheme.layer_index(layer)
    w1, b1 = scheme.w1[i].double(), scheme.b1[i].double()
    w2, b2 = scheme.w2[i].double(), scheme.b2[i].double()
    hidden = x @ w1 + b1
    hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)
    return hidden @ w2 + b2


def _bias64(scheme: DAPE, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
    """The static bias (H, Tq, Tk) from its formula, float64 (parameters in range: no clamps)."""
    distance = (q_pos.double()[:, None] - k_pos.double()[None, :]).abs()
    if scheme.bias_kind == "kerple":
        i = scheme.inner.layer_index(layer)
        r1, r2 = scheme.inner.r1[i].double(), scheme.inner.r2[i].double()
        return -r1[:, None, None] * torch.log1p(r2[:, None, None] * distance)
    slopes = torch.tensor(alibi_slopes(scheme.n_head), dtype=torch.float64)
    return -slopes[:, None, None] * distance


@pytest.mark.parametrize("bias", ["kerple", "alibi"])
@pytest.mark.parametrize("layer", [0, 1])
def test_modify_scores_is_the_formula_in_float64(bias, layer):
    """A = s + B + f([s; B]) on every causal pair, for a block of queries over keys 0..end−1."""
    scheme = _scheme(bias)
    gen = torch.Generator().manual_seed(1)
    start, end = 3, T  # queries 3..6 over keys 0..6, as a blockwise block
    scores = torch.randn(2, N_HEAD, end - start, end, generator=gen) * 3
    positions = torch.arange(end).float() * 5 + 11  # not 0..T−1: positions are read
    future = _future(end - start, end, start)
    q = torch.randn(2, N_HEAD, end - start, D_MODEL // N_HEAD)
    k = torch.randn(2, N_HEAD, end, D_MODEL // N_HEAD)
    out = scheme.modify_scores(scores, q, k, future, positions[start:], positions, layer)
    assert out.dtype == torch.float32 and out.shape == scores.shape
    s64 = scores.double()
    b64 = _bias64(scheme, positions[start:], positions, layer).expand_as(s64)
    features = torch.cat([s64, b64], dim=1).permute(0, 2, 3, 1)  # (B, Tq, Tk, 2H)
    expected = s64 + b64 + _mlp64(features, scheme, layer).permute(0, 3, 1, 2)
    past = ~future.expand_as(out)
    torch.testing.assert_close(out.double()[past], expected[past], atol=1e-5, rtol=1e-5)
    # the MLP matters (the comparison is not of s + B alone)
    assert (out.double() - s64 - b64)[past].abs().max() > 1e-2


def test_fire_bias_goes_through_the_same_formula():
    """bias=fire: B is poslab's FIRE (its formula is tests/positions/test_fire.py's), adapted
    by the MLP as the others are; the positions' offset shows (FIRE is not shift-invariant)."""
    scheme = _scheme("fire", bias_options={"threshold_init": 4.0})
    assert not scheme.shift_invariant and scheme.per_layer and scheme.inner.per_layer
    scores = torch.randn(1, N_HEAD, T, T)
    positions, future = torch.arange(T).float(), _future(T, T)
    out = scheme.modify_scores(scores, scores, scores, future, positions, positions, 1)
    b64 = scheme.inner.attention_bias(positions, positions, 1).double().expand_as(scores)
    s64 = scores.double()
    features = torch.cat([s64, b64], dim=1).permute(0, 2, 3, 1)
    expected = s64 + b64 + _mlp64(features, scheme, 1).permute(0, 3, 1, 2)
    past = ~future.expand_as(out)
    torch.testing.assert_close(out.double()[past], expected[past], atol=1e-5, rtol=1e-5)
    shifted = scheme.modify_scores(scores, scores, scores, future, positions + 9, positions + 9, 1)
    assert (shifted - out)[past].abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------
# the reference implementation: github.com/chuanyang-Zheng/DAPE at commit
# bde344a844f2bd1f498b2bac70240dcda41c50c1, megatron/model/positional_embeddings.py (the code its
# configs 125M_kerple_c.yml / 125M_alibi_c.yml train; DAPE.py at the repository's root has the
# same lines): the forward of ParallelKerpleLog_C and of AliBi_C, ported here with their
# constructors' parameters given as arguments (the CUDA device, model parallelism and the caches
# left out). The scores x arrive there already scaled by 1/norm_factor and before the causal mask
# (megatron/model/transformer.py: baddbmm(alpha=1/norm_factor), the mask in scale_mask_softmax).


def _reference_mlp2(num_heads: int, mlp_width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(num_heads * 2, mlp_width), nn.LeakyReLU(), nn.Linear(mlp_width, num_heads)
    )


def _reference_kerple_c(x, bias_p, bias_a, mlp2, eps=1e-2):  # noqa: ANN001, ANN202
    seq_len_k = x.shape[-1]
    diff = torch.tril(
        torch.arange(seq_len_k, device=x.device).view(seq_len_k, 1).repeat(1, seq_len_k)
        + torch.arange(0, -seq_len_k, -1, device=x.device)
    )
    diff = diff.to(x.dtype)
    bias_p = bias_p.clamp(min=eps)
    bias_a = bias_a.clamp(min=eps)
    bias = -bias_p * torch.log(1 + bias_a * diff)  # log kernel
    x_a_bias = torch.cat((x, torch.tile(bias, (x.shape[0], 1, 1, 1))), dim=1)
    x_a_bias = torch.permute(x_a_bias, (0, 2, 3, 1))
    x_a_bias = mlp2(x_a_bias)
    x_a_bias = torch.permute(x_a_bias, (0, 3, 1, 2))
    return x + bias + x_a_bias


def _reference_get_slopes(n):  # noqa: ANN001, ANN202
    def get_slopes_power_of_2(n):  # noqa: ANN001, ANN202
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + _reference_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def _reference_alibi_c(x, slopes, mlp2):  # noqa: ANN001, ANN202
    target_seq_len = x.shape[-1]
    a = -torch.tril(
        torch.arange(target_seq_len).view(target_seq_len, 1).repeat(1, target_seq_len)
        + torch.arange(0, -target_seq_len, -1)
    )
    a = a.to(x.device).to(x.dtype)
    a = a * slopes.to(a.dtype).view(slopes.shape[0], 1, 1)
    x_a_bias = torch.cat((x, torch.tile(a, (x.shape[0], 1, 1, 1))), dim=1)
    x_a_bias = torch.permute(x_a_bias, (0, 2, 3, 1))
    x_a_bias = mlp2(x_a_bias)
    x_a_bias = torch.permute(x_a_bias, (0, 3, 1, 2))
    return x + a + x_a_bias


def _reference_mlp_of(scheme: DAPE, layer: int) -> nn.Sequential:
    """The reference's mlp2 with this scheme's weights of `layer` (nn.Linear stores W as
    (out, in))."""
    mlp2 = _reference_mlp2(scheme.n_head, scheme.hidden).double()
    i = scheme.layer_index(layer)
    with torch.no_grad():
        mlp2[0].weight.copy_(scheme.w1[i].t())
        mlp2[0].bias.copy_(scheme.b1[i])
        mlp2[2].weight.copy_(scheme.w2[i].t())
        mlp2[2].bias.copy_(scheme.b2[i])
    return mlp2


@pytest.mark.parametrize("bias", ["kerple", "alibi"])
@pytest.mark.parametrize("layer", [0, 1])
def test_modify_scores_matches_the_reference_code(bias, layer):
    """The same numbers as ParallelKerpleLog_C / AliBi_C on every causal pair (the reference
    feeds the MLP the unmasked scores above the diagonal, which the mask then removes; here they
    enter as 0: the rows' visible entries do not depend on it)."""
    scheme = _scheme(bias, seed=3)
    x = torch.randn(3, N_HEAD, T, T, generator=torch.Generator().manual_seed(5)) * 2
    positions, future = torch.arange(T), _future(T, T)
    ours = scheme.modify_scores(x, x, x, future, positions.float(), positions.float(), layer)
    mlp2 = _reference_mlp_of(scheme, layer)
    with torch.no_grad():
        if bias == "kerple":
            i = scheme.inner.layer_index(layer)
            bias_p = scheme.inner.r1[i].double()[:, None, None]  # (heads, 1, 1) as in the reference
            bias_a = scheme.inner.r2[i].double()[:, None, None]
            reference = _reference_kerple_c(x.double(), bias_p, bias_a, mlp2)
        else:
            slopes = torch.tensor(_reference_get_slopes(N_HEAD), dtype=torch.float64)
            torch.testing.assert_close(slopes.float(), scheme.inner.slopes)
            reference = _reference_alibi_c(x.double(), slopes, mlp2)
    past = ~future.expand_as(ours)
    torch.testing.assert_close(ours.double()[past], reference[past], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# shapes, gradients, masked keys, options


def test_per_sequence_positions_give_each_sequence_its_own():
    scheme = _scheme()
    rows = torch.stack([torch.arange(T) * 3 + 2, torch.arange(T)]).float()  # (B, T)
    scores = torch.randn(2, N_HEAD, T, T)
    future = _future(T, T)
    out = scheme.modify_scores(scores, scores, scores, future, rows, rows, 1)
    assert out.shape == (2, N_HEAD, T, T)
    for b in range(2):
        alone = scheme.modify_scores(scores[b : b + 1], scores, scores, future, rows[b], rows[b], 1)
        torch.testing.assert_close(out[b : b + 1], alone)
    assert not torch.allclose(out[0], out[1])  # different positions, different scores


@pytest.mark.parametrize("bias", ["kerple", "fire"])
def test_gradients_reach_the_mlp_and_the_bias_of_the_layer(bias):
    scheme = _scheme(bias)
    scores = torch.randn(2, N_HEAD, T, T, requires_grad=True)
    positions, future = torch.arange(T).float(), _future(T, T)
    out = scheme.modify_scores(scores, scores, scores, future, positions, positions, 1)
    weights = torch.softmax(out.masked_fill(future, float("-inf")), dim=-1)
    (weights * torch.randn_like(weights)).sum().backward()
    inner = dict(scheme.inner.named_parameters())
    assert inner, "the bias has parameters"
    for name, param in [*scheme.named_parameters(), ("scores", scores)]:
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        if param is scores:
            continue
        assert param.grad[1].abs().sum() > 0, name  # layer 1's set is used
        assert param.grad[0].abs().sum() == 0, name  # layer 0's set is not


@pytest.mark.parametrize("per_sequence", [False, True])
def test_pair_mlp_backward_is_the_derivative(per_sequence, monkeypatch):
    """PairMLP's hand-written backward (chunked, the hidden layer recomputed) against finite
    differences in float64, with chunks smaller than a sequence's pairs and a bias shared by
    the sequences or one per sequence."""
    monkeypatch.setattr(PairMLP, "CHUNK_FLOATS", 40)  # 6 hidden units: chunks of 6 of 13 pairs
    gen = torch.Generator().manual_seed(0)

    def arg(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    bias = arg(2, 3, 13) if per_sequence else arg(3, 13)
    args = (arg(2, 3, 13), bias, arg(6, 3), arg(6, 3), arg(6), arg(3, 6), arg(3))
    assert torch.autograd.gradcheck(PairMLP.apply, args)


@pytest.mark.parametrize("window", [None, 3])
def test_gradients_equal_the_formula_differentiated_by_autograd(window):
    """Values and every gradient (scores, MLP, bias parameters) on the pairs a query sees equal
    those of the formula written with autograd in float64 (DAPE computes in fp32), for a block
    of queries."""
    scheme = _scheme("kerple").double()
    gen = torch.Generator().manual_seed(2)
    start, end = 2, T
    scores = (torch.randn(2, N_HEAD, end - start, end, generator=gen) * 3).double()
    scores.requires_grad_()
    positions = torch.arange(end).double()
    future = masked_keys(torch.arange(end), start, end, 0, window)
    upstream = torch.randn(scores.shape, generator=gen, dtype=torch.float64)
    past = ~future.expand_as(scores)

    def grads(out: torch.Tensor) -> list[torch.Tensor]:
        params = [scores, *scheme.parameters()]
        return [out.detach(), *torch.autograd.grad((out * upstream)[past].sum(), params)]

    got = grads(scheme.modify_scores(scores, scores, scores, future, positions[start:], positions))
    bias = scheme.inner.attention_bias(positions[start:], positions, 0).expand_as(scores)
    features = torch.cat([scores, bias], dim=1).permute(0, 2, 3, 1)
    expected = grads(scores + bias + _mlp64(features, scheme, 0).permute(0, 3, 1, 2))
    got[0], expected[0] = got[0][past], expected[0][past]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


def test_masked_keys_cannot_make_nan():
    """−inf (or huge values) where the kernel masks: finite visible scores and gradients."""
    scheme = _scheme()
    scores = torch.randn(1, N_HEAD, T, T)
    future = _future(T, T)
    masked = scores.masked_fill(future, float("-inf")).requires_grad_(True)
    positions = torch.arange(T).float()
    out = scheme.modify_scores(masked, masked, masked, future, positions, positions, 0)
    plain = scheme.modify_scores(scores, scores, scores, future, positions, positions, 0)
    past = ~future.expand_as(out)
    assert torch.isfinite(out[past]).all()
    torch.testing.assert_close(out[past], plain[past])  # the future's values change nothing
    weights = torch.softmax(out.masked_fill(future, float("-inf")), dim=-1)
    weights.sum(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in scheme.parameters())


def test_shared_parameters_with_per_layer_false():
    scheme = _scheme(per_layer=False)
    assert scheme.w1.shape == (1, 2 * N_HEAD, 32) and scheme.inner.r1.shape == (1, N_HEAD)
    assert _scheme(hidden=8).w1.shape == (N_LAYER, 2 * N_HEAD, 8)
    assert _scheme("alibi").shift_invariant and DAPE.shift_invariant


@pytest.mark.parametrize("bias", ["alibi", "fire"])
def test_other_biases_keep_causality_in_a_model(bias):
    """test_properties.py checks the default (kerple) with every kernel; the other biases here:
    later tokens change no earlier logit."""
    model = tiny_gpt("dape", "blockwise", kernel_options={"block_size": 5}, bias=bias)
    idx = tokens(2, 12)
    changed = idx.clone()
    changed[:, 6:] = (idx[:, 6:] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :6], before[:, :6], atol=1e-5, rtol=0)
    assert (after[:, 6:] - before[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"bias": "rope"}, "pos.bias=rope is not one of kerple, alibi, fire"),
        ({"hidden": 0}, "pos.hidden=0 must be an integer ≥ 1"),
        ({"hidden": 2.5}, "pos.hidden=2.5 must be an integer ≥ 1"),
        ({"per_layer": "yes"}, "pos.per_layer=yes must be true or false"),
        ({"bias_options": {"width": 8}}, "pos.bias_options={'width': 8"),
        ({"bias_options": {"variant": "cubic"}}, "pos.variant=cubic is not one of log, power"),
        ({"bias_options": 3}, "pos.bias_options=3 must be a mapping"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)) as err:
        build_scheme("dape", D_MODEL, N_HEAD, **options)
    assert "\n" not in str(err.value)
