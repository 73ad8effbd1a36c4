"""Causal attention kernels: the config group `attention=` (conf/attention/).

A kernel says which needs of a positional scheme it serves (positions/base.py: "nothing",
"bias", "scores"); `check` turns an impossible pairing into a ConfigError when the model is built.

* ``auto`` (default): ``sdpa`` where it serves the scheme, else ``blockwise``; logged.
* ``sdpa`` (serves nothing, bias). No bias (nope, learned, sinusoidal, rope): one
  `scaled_dot_product_attention` call with `is_causal=True` (flash / memory-efficient kernels on
  CUDA, the fused flash kernel on CPU: memory linear in the length). With a bias (alibi, t5,
  kerple, ...): the bias is built once per forward (`CausalBias`) and shared by every layer when
  the whole (H, T, T) matrix is below `full_bias_mib` (training lengths); otherwise queries go in
  blocks of `block_size`, each seeing only the keys up to its last query with its bias built for
  that block alone: memory O(block_size · T) per head, so 16× the training length fits on a CPU.
* ``blockwise`` (serves all three): the scores computed explicitly in fp32, in query blocks of
  `block_size`, bias added, scores changed by the scheme (CoPE), softmax: the reference kernel,
  and the only one for schemes that need the scores.
* ``flex`` (serves nothing, bias): FlexAttention (torch ≥ 2.5) with the scheme's `score_bias` as
  `score_mod` and a causal block mask: the bias is computed inside the fused kernel and never
  stored. Compiled on CUDA (its purpose); on a CPU it runs eagerly, forward only (tests, eval).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.checks import integer, number, require
from poslab.errors import ConfigError
from poslab.precision import compute_dtype

KERNELS = ("auto", "sdpa", "blockwise", "flex", "linear")
NEEDS = ("nothing", "bias", "scores")  # what a scheme may need (positions/base.py)
log = logging.getLogger(__name__)
BiasFn = Callable[[Tensor, Tensor], Tensor]  # (q_positions, k_positions) -> (H, Tq, Tk) fp32
ScoreBias = Callable[[Tensor, Tensor, Tensor], Tensor]  # (head, q_pos, k_pos) -> bias
# build the whole causal bias once per forward, shared by all layers, below this size
FULL_BIAS_BYTES = 256 * 2**20


class CausalBias:
    """A scheme's causal score bias for one forward, in the dtype of the attention scores.

    Positions and the bias are exact fp32; under bf16 autocast the bias is then rounded to bf16
    like the q·k scores it is added to (relative error 2^-9): keys stay distinct, but a far key's
    already small weight e^bias moves by up to |bias|/512.
    """

    def __init__(
        self,
        bias_fn: BiasFn,
        positions: Tensor,
        n_head: int,
        dtype: torch.dtype,
        block_size: int,
        full_bias_bytes: int | None = None,
    ) -> None:
        self.bias_fn = bias_fn
        self.positions = positions
        self.dtype = dtype
        seq_len = positions.shape[-1]
        self.index = torch.arange(seq_len, device=positions.device)
        limit = FULL_BIAS_BYTES if full_bias_bytes is None else full_bias_bytes
        batch = positions.shape[0] if positions.dim() == 2 else 1  # per-sequence positions
        full = batch * n_head * seq_len * seq_len * torch.finfo(dtype).bits // 8 <= limit
        self.block_size = seq_len if full else max(1, block_size)
        self.full = self._build(0, seq_len) if full else None

    def _build(self, start: int, end: int) -> Tensor:
        # causality is by index (the order of tokens), bias is by position (what the scheme sees)
        future = self.index[None, :end] > self.index[start:end, None]
        bias = self.bias_fn(self.positions[..., start:end], self.positions[..., :end])
        bias = bias.masked_fill(future, float("-inf")).to(self.dtype)
        return bias if bias.dim() == 4 else bias.unsqueeze(0)  # (B or 1, H, Tq, Tk)

    def block(self, start: int, end: int) -> Tensor:
        """(1 or B, H, end − start, end): the bias of queries start..end−1 over keys 0..end−1."""
        if self.full is not None:
            return self.full[:, :, start:end, :end]
        return self._build(start, end)


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    bias_fn: BiasFn | None = None,
    dropout_p: float = 0.0,
    block_size: int = 1024,
    bias: CausalBias | None = None,
) -> Tensor:
    """q, k, v: (B, H, T, D); positions: (T,) or (B, T). Returns (B, H, T, D). The bias comes
    prepared (`bias`, as the model passes it) or as a function of positions (`bias_fn`)."""
    if bias is None and bias_fn is not None:
        bias = CausalBias(bias_fn, positions, q.shape[1], q.dtype, block_size, full_bias_bytes=0)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    seq_len = q.shape[-2]
    if bias.block_size < seq_len:
        # q, k, v arrive as transposed views; one copy here spares SDPA a copy of the growing
        # key/value prefix for every block
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    outputs = []
    for start in range(0, seq_len, bias.block_size):
        end = min(start + bias.block_size, seq_len)
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end],
                k[:, :, :end],
                v[:, :, :end],
                attn_mask=bias.block(start, end),
                dropout_p=dropout_p,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_kernel(device_type: str) -> Callable:
    if device_type == "cuda":
        return _compiled_flex_attention()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention  # eager: a reference path for tests on CPUs


class FlexMask:
    """The causal block mask and the score_mod of one forward (built once, used by all layers)."""

    def __init__(
        self, score_bias: ScoreBias | None, positions_fp32: Tensor, position_axes: int = 0
    ) -> None:
        if not flex_available():
            raise ConfigError("attention=flex needs torch >= 2.5; use attention=sdpa")
        from torch.nn.attention.flex_attention import create_block_mask

        # positions are (…, T), or (…, T, A) for a scheme of A position axes
        seq_len = positions_fp32.shape[-2] if position_axes else positions_fp32.shape[-1]
        device = positions_fp32.device

        def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return q_idx >= kv_idx

        self.block_mask = create_block_mask(causal, None, None, seq_len, seq_len, device=device)
        self.score_mod = None
        if score_bias is not None:
            batched = positions_fp32.dim() == (3 if position_axes else 2)  # per sequence
            pos = positions_fp32 if batched else positions_fp32[None]

            def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
                row = pos[b] if batched else pos[0]
                return score + score_bias(h, row[q_idx], row[kv_idx]).to(score.dtype)

            self.score_mod = score_mod


def flex_causal_attention(q: Tensor, k: Tensor, v: Tensor, mask: FlexMask) -> Tensor:
    kernel = _flex_kernel(q.device.type)
    return kernel(q, k, v, score_mod=mask.score_mod, block_mask=mask.block_mask)


# what the model hands every layer's attention for one forward (None: plain causal)
AttentionBias = CausalBias | FlexMask | None


class AttentionKernel:
    """One attention kernel: what it serves, and the attention of one layer."""

    name: str = ""
    serves: tuple[str, ...] = ("nothing",)
    trains_on_cpu: bool = True
    has_dropout: bool = True
    softmax: bool = True  # False: another function of q, k, v (a different model; tables say so)
    # True: the kernel applies the scheme's rotation itself (linear attention rotates features
    # after its feature map); the model then hands it q and k unrotated
    rotates_inside: bool = False

    def __init__(self, block_size: int = 1024) -> None:
        require("attention.block_size", block_size, integer(1))
        self.block_size = block_size

    @classmethod
    def row_label(cls, options: dict[str, Any]) -> str:
        """What result tables add to a model's name for this kernel and its options: nothing
        for a softmax kernel (they compute the same function)."""
        return ""

    def check(self, pos: Any, dropout: float) -> None:
        """An impossible pairing is a one-line error when the model is built."""
        if pos.needs not in self.serves:
            able = [k.name for k in (Auto, SDPA, Blockwise, Flex) if pos.needs in k.serves]
            raise ConfigError(
                f"attention={self.name} cannot serve pos={type(pos).__name__}, which needs "
                f"the {pos.needs} (it serves: {', '.join(self.serves)}); use "
                f"attention={' or attention='.join(able)}"
            )
        if dropout > 0 and not self.has_dropout:
            raise ConfigError(
                f"attention={self.name} has no attention dropout; set model.dropout=0 or use "
                "attention=sdpa"
            )

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        """Per-forward state shared by the layers (a bias, a mask); None by default."""
        return None

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pos: Any,
        prepared: Any,
        state: Any,
        layer: int,
        dropout_p: float,
    ) -> Tensor:
        raise NotImplementedError


def _bias_fn(pos: Any, layer: int) -> BiasFn:
    return functools.partial(pos.attention_bias, layer=pos.layer_index(layer))


class SDPA(AttentionKernel):
    name = "sdpa"
    serves = ("nothing", "bias")

    def __init__(self, block_size: int = 1024, full_bias_mib: float = 256) -> None:
        super().__init__(block_size)
        # a size in MiB: 0 builds the bias per block always; a negative size means nothing
        require("attention.full_bias_mib", full_bias_mib, number(ge=0))
        self.full_bias_bytes = int(full_bias_mib * 2**20)

    def _bias(self, pos: Any, prepared: Any, dtype: torch.dtype, layer: int) -> CausalBias:
        return CausalBias(
            _bias_fn(pos, layer),
            prepared.fp32,
            pos.n_head,
            compute_dtype(dtype, prepared.fp32.device.type),
            self.block_size,
            self.full_bias_bytes,
        )

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        if pos.needs == "bias" and not pos.per_layer:  # one bias for every layer
            return self._bias(pos, prepared, dtype, 0)
        return None

    def __call__(self, q, k, v, pos, prepared, state, layer, dropout_p):  # noqa: ANN001
        bias = state
        if pos.needs == "bias" and bias is None:  # per-layer parameters: this layer's bias
            bias = self._bias(pos, prepared, q.dtype, layer)
        return causal_attention(q, k, v, prepared.fp32, dropout_p=dropout_p, bias=bias)


class Blockwise(AttentionKernel):
    name = "blockwise"
    serves = ("nothing", "bias", "scores")

    def weights(
        self, q: Tensor, k: Tensor, pos: Any, prepared: Any, layer: int, start: int, end: int
    ) -> Tensor:
        """fp32 attention probabilities (B or 1, H, end − start, end) of queries start..end−1
        over keys 0..end−1, every scheme hook applied: the reference definition of attention
        (also used by analysis tools that look at the weights)."""
        seq_len, scale = q.shape[-2], q.shape[-1] ** -0.5
        index = torch.arange(seq_len, device=q.device)
        positions = prepared.fp32
        q_block = q[:, :, start:end]
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_block, keys = q_block.float(), k[:, :, :end].float()
            scores = (q_block @ keys.transpose(-1, -2)) * scale
            future = index[None, :end] > index[start:end, None]
            if pos.needs == "bias":
                # (H, Tq, Tk), or (B, H, Tq, Tk) for per-sequence positions: broadcasts
                scores = scores + _bias_fn(pos, layer)(
                    positions[..., start:end], positions[..., :end]
                )
            elif pos.needs == "scores":
                scores = pos.modify_scores(
                    scores,
                    q_block,
                    keys,
                    future,
                    positions[..., start:end],
                    positions[..., :end],
                    layer,
                )
            return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)

    def __call__(self, q, k, v, pos, prepared, state, layer, dropout_p):  # noqa: ANN001
        seq_len = q.shape[-2]
        outputs = []
        for start in range(0, seq_len, self.block_size):
            end = min(start + self.block_size, seq_len)
            weights = self.weights(q, k, pos, prepared, layer, start, end)
            weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
            outputs.append(weights.to(v.dtype) @ v[:, :, :end])
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


class Flex(AttentionKernel):
    name = "flex"
    serves = ("nothing", "bias")
    trains_on_cpu = False  # FlexAttention has no backward pass on CPUs
    has_dropout = False

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        if pos.per_layer:
            return None
        return FlexMask(_score_bias_fn(pos, 0), prepared.fp32, pos.position_axes)

    def __call__(self, q, k, v, pos, prepared, state, layer, dropout_p):  # noqa: ANN001
        mask = state or FlexMask(_score_bias_fn(pos, layer), prepared.fp32, pos.position_axes)
        return flex_causal_attention(q, k, v, mask)


class Auto(AttentionKernel):
    """The default: sdpa where it can serve the scheme (the fast path), else blockwise (schemes
    that need the scores). The choice is made, and logged, when the model is built."""

    name = "auto"
    serves = NEEDS

    def __init__(self, block_size: int = 1024, full_bias_mib: float = 256) -> None:
        super().__init__(block_size)
        require("attention.full_bias_mib", full_bias_mib, number(ge=0))  # at once, not at check()
        self.options = {"block_size": block_size, "full_bias_mib": full_bias_mib}
        self.chosen: AttentionKernel | None = None

    def check(self, pos: Any, dropout: float) -> None:
        if pos.needs in SDPA.serves:
            self.chosen = SDPA(**self.options)
        else:
            self.chosen = Blockwise(self.options["block_size"])
        log.info("attention=auto -> %s for %s", self.chosen.name, type(pos).__name__)
        self.chosen.check(pos, dropout)

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        return self.chosen.begin(pos, prepared, dtype)

    def __call__(self, q, k, v, pos, prepared, state, layer, dropout_p):  # noqa: ANN001
        return self.chosen(q, k, v, pos, prepared, state, layer, dropout_p)


def _score_bias_fn(pos: Any, layer: int) -> ScoreBias | None:
    if pos.needs != "bias":
        return None
    return functools.partial(pos.score_bias, layer=pos.layer_index(layer))


def kernel_from_legacy(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """The attention config of a checkpoint written before `attention=` was a config group
    (model.attention, model.attn_block_size)."""
    name = model_cfg.get("attention", "auto")
    target = {"auto": Auto, "sdpa": SDPA, "blockwise": Blockwise, "flex": Flex}[name]
    return {
        "_target_": f"{__name__}.{target.__name__}",
        "block_size": model_cfg.get("attn_block_size", 1024),
    }
