"""DAPE (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation"): a positional bias made data-dependent by a small MLP over the heads.

For every query–key pair (m, n) an MLP f: R^{2H} -> R^H, shared by all pairs, sees the vector of
the H heads' scaled scores and the H heads' biases of a static scheme, and its output is added
to both:

    A_h(m, n) = s_h(m, n) + B_h(m, n) + f([s(m, n) ; B(m, n)])_h,    s = q·k/√d,
    f(x) = W2 · LeakyReLU(W1 · x + b1) + b2     (hidden width `hidden`, LeakyReLU slope 0.01)

B is KERPLE-log (`bias=kerple`, the paper's best), ALiBi or FIRE, built from poslab's own
classes (positions/kerple.py, alibi.py, fire.py) with `bias_options`. As in the reference code
(chuanyang-Zheng/DAPE, megatron/model/positional_embeddings.py: ParallelKerpleLog_C, AliBi_C,
FIRE_C, one module per attention layer) each layer has its own MLP and its own bias parameters
with `per_layer=true`; the MLP's layers start as nn.Linear does (uniform in ±1/√fan_in).

The reference feeds the MLP the scores before the causal mask (its bias is zero above the
diagonal). The MLP acts on each pair alone, so here it runs on the pairs a query sees only
(about half of a causal block); masked (future) pairs keep the bare score, which the kernel
hides, so whatever the kernel passes there (a −inf included) cannot make a NaN, nor a NaN
gradient. Computed in fp32, by `PairMLP`: its hidden layer is made in cache-sized chunks and
recomputed for the backward pass rather than stored (it is `hidden` floats per pair).

DAPE needs the scores, so it runs with attention=blockwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from poslab.checks import boolean, choice, integer, require
from poslab.errors import ConfigError
from poslab.positions.alibi import ALiBi
from poslab.positions.base import PositionalScheme
from poslab.positions.fire import Fire
from poslab.positions.kerple import Kerple

BIASES: dict[str, type[PositionalScheme]] = {"kerple": Kerple, "alibi": ALiBi, "fire": Fire}
LEAKY_SLOPE = 0.01  # nn.LeakyReLU's default, as the reference uses it


class DAPE(PositionalScheme):
    needs = "scores"
    # true for the default bias (kerple) and for alibi: scores and bias depend on m − n only;
    # an instance with bias=fire says False (FIRE normalises by the query's position)
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        bias: str = "kerple",
        hidden: int = 32,
        per_layer: bool = True,
        bias_options: Mapping[str, Any] | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.bias", bias, choice(*BIASES))
        require("pos.hidden", hidden, integer(1))
        require("pos.per_layer", per_layer, boolean())
        if bias_options is not None and not isinstance(bias_options, Mapping):
            raise ConfigError(
                f"pos.bias_options={bias_options!r} must be a mapping of {bias} options, "
                "e.g. {variant: power}"
            )
        self.bias_kind = bias
        self.hidden = hidden
        self.per_layer = per_layer
        self.inner = self._inner(bias, dict(bias_options or {}))
        self.shift_invariant = type(self.inner).shift_invariant  # type: ignore[misc]
        sets, heads = self.n_layer if per_layer else 1, n_head
        # the MLP's two layers, initialised as nn.Linear does (uniform in ±1/√fan_in); inputs
        # are the H scores, then the H biases (the reference's torch.cat((x, bias), dim=1))
        bound1, bound2 = (2 * heads) ** -0.5, hidden**-0.5
        self.w1 = nn.Parameter((torch.rand(sets, 2 * heads, hidden) * 2 - 1) * bound1)
        self.b1 = nn.Parameter((torch.rand(sets, hidden) * 2 - 1) * bound1)
        self.w2 = nn.Parameter((torch.rand(sets, hidden, heads) * 2 - 1) * bound2)
        self.b2 = nn.Parameter((torch.rand(sets, heads) * 2 - 1) * bound2)

    def _inner(self, bias: str, options: dict[str, Any]) -> PositionalScheme:
        """The static bias scheme, with this scheme's sizes and per-layer choice."""
        cls = BIASES[bias]
        if cls is not ALiBi:  # kerple and fire take per_layer; alibi's slopes are fixed
            options.setdefault("per_layer", self.per_layer)
        try:
            return cls(self.d_model, self.n_head, n_layer=self.n_layer, **options)
        except TypeError as err:
            raise ConfigError(
                f"pos.bias_options={options!r} does not suit bias={bias} ({err}); "
                f"see conf/pos/{bias}.yaml for its options"
            ) from None

    def mlp(self, scores: Tensor, bias: Tensor, layer: int) -> Tensor:
        """f([scores; bias]) for scores (B, H, N) and bias (H, N) or (B, H, N), N pairs, the
        heads as channels -> (B, H, N), fp32."""
        i = self.layer_index(layer)
        w1, heads = self.w1[i].float().t(), self.n_head  # (hidden, 2H): scores, then biases
        weights = (w1[:, :heads], w1[:, heads:], self.b1[i].float())
        return PairMLP.apply(scores, bias, *weights, self.w2[i].float().t(), self.b2[i].float())

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
        with torch.autocast(device_type=scores.device.type, enabled=False):
            scores = scores.float()
            bias = self.inner.attention_bias(q_positions, k_positions, layer).float()
            # the MLP acts on each pair alone, so it runs on the pairs a query sees only (about
            # half of a causal block): its hidden layer, `hidden` channels per pair, is the cost.
            # Masked pairs keep the bare score (the kernel hides them); no −inf reaches the MLP.
            seen = (~future).flatten().nonzero().squeeze(1)
            seen_scores = scores.flatten(-2).index_select(-1, seen)  # (B, H, N)
            seen_bias = bias.flatten(-2).index_select(-1, seen)  # (H, N) or (B, H, N)
            adapted = self.mlp(seen_scores, seen_bias, layer).add_(seen_bias)
            return scores.flatten(-2).index_add(-1, seen, adapted).view_as(scores)

    def check_length(self, max_position: int) -> None:
        self.inner.check_length(max_position)

    def metrics(self) -> dict[str, Tensor]:
        return self.inner.metrics()


class PairMLP(torch.autograd.Function):
    """W2·LeakyReLU(W1_s·s + W1_B·B + b1) + b2 for every pair, the heads as channels: s (B, H, N)
    the scores, B (H, N) or (B, H, N) the biases, w1_s and w1_b (hidden, H), b1 (hidden),
    w2 (H, hidden), b2 (H) -> (B, H, N).

    Autograd would keep the hidden layer, `hidden` channels per pair (eight times the scores
    for H = 4), in memory and pass over it about a dozen times at memory speed. Here it is made
    in chunks of pairs small enough to stay in the cache, once forward and once again backward
    (recomputed from s and B), and never stored whole: the bias half W1_B·B + b1, which has no
    batch dimension, once per chunk for every sequence.
    """

    # floats per chunk: a (hidden, pairs) fp32 block of 4 MB, well within a CPU's L3 cache; on
    # a GPU, where each chunk costs kernel launches, 64 times that
    CHUNK_FLOATS = 2**20
    GPU_CHUNKS_PER_CHUNK = 64

    @staticmethod
    def forward(ctx: Any, scores: Tensor, bias: Tensor, *weights: Tensor) -> Tensor:  # noqa: D102
        ctx.save_for_backward(scores, bias, *weights)
        _, _, _, w2, b2 = weights
        out = torch.empty_like(scores)
        for b, cols, hidden in PairMLP._hidden(scores, bias, *weights[:3]):
            out[b, :, cols] = torch.addmm(b2[:, None], w2, F.leaky_relu_(hidden, LEAKY_SLOPE))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, ...]:  # noqa: D102
        scores, bias, w1_s, w1_b, b1, w2, _ = ctx.saved_tensors
        grad_scores = torch.empty_like(scores)
        grad_bias = torch.empty_like(bias)
        grad_w1_s, grad_w1_b, grad_w2 = (torch.zeros_like(w) for w in (w1_s, w1_b, w2))
        grad_b1 = torch.zeros_like(b1)
        per_sequence = bias.dim() == 3
        for b, cols, hidden in PairMLP._hidden(scores, bias, w1_s, w1_b, b1):
            g = grad[b, :, cols]  # (H, n)
            grad_w2.addmm_(g, F.leaky_relu(hidden, LEAKY_SLOPE).t())
            grad_hidden = torch.ops.aten.leaky_relu_backward(w2.t() @ g, hidden, LEAKY_SLOPE, False)
            grad_w1_s.addmm_(grad_hidden, scores[b, :, cols].t())
            grad_scores[b, :, cols] = w1_s.t() @ grad_hidden
            # the bias half: summed over the sequences that share it
            if per_sequence or b == 0:
                grad_half = grad_hidden
            else:
                grad_half += grad_hidden
            if per_sequence or b == scores.shape[0] - 1:
                biases = bias[b, :, cols] if per_sequence else bias[:, cols]
                grad_w1_b.addmm_(grad_half, biases.t())
                grad_b1 += grad_half.sum(1)
                target = grad_bias[b] if per_sequence else grad_bias
                target[:, cols] = w1_b.t() @ grad_half
        return grad_scores, grad_bias, grad_w1_s, grad_w1_b, grad_b1, grad_w2, grad.sum((0, 2))

    @staticmethod
    def _hidden(
        scores: Tensor, bias: Tensor, w1_s: Tensor, w1_b: Tensor, b1: Tensor
    ) -> Iterator[tuple[int, slice, Tensor]]:
        """(b, pairs, W1_s·s + W1_B·B + b1) for every chunk of pairs, every sequence b in turn
        within a chunk."""
        n_pairs, batch = scores.shape[-1], scores.shape[0]
        floats = PairMLP.CHUNK_FLOATS
        if scores.device.type != "cpu":
            floats *= PairMLP.GPU_CHUNKS_PER_CHUNK
        chunk = max(1, floats // w1_s.shape[0])
        for start in range(0, n_pairs, chunk):
            cols = slice(start, min(start + chunk, n_pairs))
            half = None if bias.dim() == 3 else torch.addmm(b1[:, None], w1_b, bias[:, cols])
            for b in range(batch):
                if bias.dim() == 3:
                    half = torch.addmm(b1[:, None], w1_b, bias[b, :, cols])
                yield b, cols, torch.addmm(half, w1_s, scores[b, :, cols])
