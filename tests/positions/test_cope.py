"""positions/cope.py: contextual positions and the interpolation of their embeddings."""

from __future__ import annotations

import pytest
import torch

from poslab.model.attention import masked_keys
from poslab.positions.cope import ContextualScores, CoPE

D_MODEL, N_HEAD = 32, 4


def test_cope_positions_and_interpolation():
    scheme = CoPE(8, 2, npos=8)
    scores = torch.randn(1, 2, 6, 6)
    future = torch.arange(6)[None, :] > torch.arange(6)[:, None]
    pos = scheme.positions_from_scores(scores, future)
    distance = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).expand_as(pos)
    past, later = (~future).expand_as(pos), future.expand_as(pos)
    # non-decreasing as n moves back, within (0, m − n + 1], zero for future keys
    step_back = pos[..., :-1] - pos[..., 1:]
    assert torch.all(step_back[past[..., 1:]] >= -1e-6)
    assert torch.all(pos[past] > 0) and torch.all(pos[past] <= distance[past] + 1)
    assert torch.all(pos[later] == 0)
    # hand-computed: q·e[p] interpolated between floor and ceil
    with torch.no_grad():
        scheme.pos_emb.copy_(torch.arange(8 * 4).view(8, 4).float())
    q = torch.ones(1, 1, 1, 4)
    one = torch.tensor([[[[0.0]]]])  # sigmoid(0) = 0.5 -> p = 0.5 for the only key
    zero = torch.zeros(1)
    out = scheme.modify_scores(one, q, q, torch.zeros(1, 1, dtype=torch.bool), zero, zero)
    e0, e1 = scheme.pos_emb[0].sum(), scheme.pos_emb[1].sum()
    assert out.item() == pytest.approx(0.5 * e0.item() + 0.5 * e1.item())


def _autograd_cope(scheme: CoPE, scores: torch.Tensor, q: torch.Tensor, future: torch.Tensor):
    """CoPE's scores as autograd differentiates them: the formula of the module doc, written
    with flips, a cumsum and int64 gathers."""
    gates = torch.sigmoid(scores).masked_fill(future, 0.0)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=scheme.npos - 1)
    logits = (q.float() @ scheme.pos_emb.float().t()).to(scores.dtype)
    steps = torch.nn.functional.pad(logits.diff(dim=-1), (0, 1))
    floor = pos.floor()
    index = floor.long()
    return scores + logits.gather(-1, index) + (pos - floor) * steps.gather(-1, index)


@pytest.mark.parametrize(("start", "window"), [(0, None), (5, None), (0, 4)])
def test_fast_path_equals_the_formula_and_its_gradients(start, window):
    """ContextualScores (int32 flat offsets, a written-out backward) gives the values and every
    gradient (scores, queries, embeddings) of the formula under autograd, for a block of
    queries start..end−1 over keys 0..end−1, with a sliding window too; positions pass the
    last embedding (npos = 3), so the clamp is exercised."""
    torch.manual_seed(0)
    end, npos = 16, 3
    scheme = CoPE(D_MODEL, N_HEAD, npos=npos)
    torch.nn.init.normal_(scheme.pos_emb)
    scores = (torch.randn(2, N_HEAD, end - start, end) * 3).requires_grad_()
    q = torch.randn(2, N_HEAD, end - start, D_MODEL // N_HEAD, requires_grad=True)
    future = masked_keys(torch.arange(end), start, end, 0, window)
    upstream = torch.randn(scores.shape).masked_fill(future, 0.0)
    results = []
    for fn in (
        lambda: scheme.modify_scores(scores, q, q, future, torch.zeros(1), torch.zeros(1)),
        lambda: _autograd_cope(scheme, scores, q, future),
    ):
        out = fn()
        grads = torch.autograd.grad((out * upstream).sum(), [scores, q, scheme.pos_emb])
        results.append([out.detach().masked_fill(future, 0.0), *grads])
    positions = scheme.positions_from_scores(scores.detach(), future)
    assert positions.max() > npos - 1  # some pairs are clamped to the last embedding
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fast_path_backward_is_the_derivative():
    """The written-out backward against finite differences in float64 (int64 offsets there),
    with positions kept off the integers, where the interpolation has a kink."""
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(1, 2, 5, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    future = torch.arange(5)[None, :] > torch.arange(5)[:, None]
    assert torch.autograd.gradcheck(ContextualScores.apply, (scores, logits, future), eps=1e-7)


def test_what_the_scores_hold_where_a_query_cannot_see_changes_nothing():
    """−inf or NaN in the masked (future) scores, as a kernel may pass them: the seen pairs'
    values and every gradient are those of clean scores."""
    torch.manual_seed(1)
    scheme = CoPE(D_MODEL, N_HEAD, npos=4)
    torch.nn.init.normal_(scheme.pos_emb)
    clean = torch.randn(1, N_HEAD, 6, 6)
    q = torch.randn(1, N_HEAD, 6, D_MODEL // N_HEAD)
    future = torch.arange(6)[None, :] > torch.arange(6)[:, None]
    results = []
    for fill in (None, float("-inf"), float("nan")):
        scores = (clean if fill is None else clean.masked_fill(future, fill)).requires_grad_()
        out = scheme.modify_scores(scores, q, q, future, torch.zeros(1), torch.zeros(1))
        weights = torch.softmax(out.masked_fill(future, float("-inf")), dim=-1)
        (grad,) = torch.autograd.grad((weights * torch.arange(6.0)).sum(), [scores])
        results.append((out.masked_fill(future, 0.0), grad.masked_fill(future, 0.0)))
    for out, grad in results[1:]:
        torch.testing.assert_close(out, results[0][0])
        torch.testing.assert_close(grad, results[0][1])
