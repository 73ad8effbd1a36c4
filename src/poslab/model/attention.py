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
  A data-dependent decay alone (FoX) needs no bias: it enters as one more key dimension and
  the fused kernel runs in fp32 (`decay_attention`); with dropout or a window, and on a GPU
  under bf16 (not yet timed there), it is a bias.
* ``blockwise`` (serves all three): the scores computed explicitly in fp32, in query blocks of
  `block_size`, bias added, scores changed by the scheme (CoPE), softmax: the reference kernel,
  and the only one for schemes that need the scores.
* Attention sinks (``model.sinks=true``): a learned logit per layer and head joins every
  query's softmax as one more key whose value is zero (gpt-oss), so a query may give part of
  its attention to nothing. ``sdpa`` serves them as a zero key in front of the others, its
  score the sink logit as one more column of the bias; ``blockwise`` as one more column of its
  scores. FlexAttention's score_mod cannot add a key, and linear and stick-breaking attention
  have no softmax: they refuse sinks when the model is built.
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

from poslab.checks import boolean, integer, number, require
from poslab.errors import ConfigError
from poslab.model.precision import compute_dtype

KERNELS = ("auto", "sdpa", "blockwise", "flex", "linear", "stick_breaking")
# what a scheme may need (positions/base.py), in order: a kernel that serves one need serves
# those before it, so a per-layer schedule needs the most demanding of its layers' needs
NEEDS = ("nothing", "decay", "bias", "scores")
log = logging.getLogger(__name__)
BiasFn = Callable[[Tensor, Tensor], Tensor]  # (q_positions, k_positions) -> (H, Tq, Tk) fp32
ScoreBias = Callable[[Tensor, Tensor, Tensor], Tensor]  # (head, q_pos, k_pos) -> bias
# build the whole causal bias once per forward, shared by all layers, below this size
FULL_BIAS_BYTES = 256 * 2**20


class CausalBias:
    """A scheme's causal score bias for one forward (or one layer), in the dtype of the scores.

    The bias is the sum of what applies: the scheme's positional bias (`bias_fn`), a
    data-dependent decay c (B, H, T) seen as c_i − c_j (FoX's cumulative log forget gates), and
    the mask of a sliding `window` (a query sees its last `window` keys, itself included).
    Positions, the bias and the decay are exact fp32; under bf16 autocast the sum is then rounded
    to bf16 like the q·k scores it is added to (relative error 2^-9): keys stay distinct, but a
    far key's already small weight e^bias moves by up to |bias|/512.
    """

    def __init__(
        self,
        bias_fn: BiasFn | None,
        positions: Tensor,
        n_head: int,
        dtype: torch.dtype,
        block_size: int,
        full_bias_bytes: int | None = None,
        decay: Tensor | None = None,
        window: int | None = None,
    ) -> None:
        self.bias_fn = bias_fn
        self.positions = positions
        self.dtype = dtype
        self.decay = decay
        self.window = window
        seq_len = positions.shape[-1]
        self.index = torch.arange(seq_len, device=positions.device)
        limit = FULL_BIAS_BYTES if full_bias_bytes is None else full_bias_bytes
        batch = positions.shape[0] if positions.dim() == 2 else 1  # per-sequence positions
        batch = decay.shape[0] if decay is not None else batch
        full = batch * n_head * seq_len * seq_len * torch.finfo(dtype).bits // 8 <= limit
        self.block_size = seq_len if full else max(1, block_size)
        self.full = self._build(0, seq_len) if full else None

    def first_key(self, start: int) -> int:
        """The first key a block of queries from `start` on can see (0 without a window)."""
        return 0 if self.window is None else max(0, start - self.window + 1)

    def _build(self, start: int, end: int) -> Tensor:
        # causality is by index (the order of tokens), bias is by position (what the scheme sees)
        first = self.first_key(start)
        hidden = masked_keys(self.index, start, end, first, self.window)
        bias = torch.zeros((), device=self.index.device)
        if self.bias_fn is not None:
            bias = self.bias_fn(self.positions[..., start:end], self.positions[..., first:end])
        if self.decay is not None:
            with torch.autocast(device_type=self.decay.device.type, enabled=False):
                decay = self.decay.float()
                bias = bias + decay[..., start:end, None] - decay[..., None, first:end]
        bias = torch.where(hidden, float("-inf"), bias).to(self.dtype)
        while bias.dim() < 4:  # (B or 1, H or 1, Tq, Tk)
            bias = bias.unsqueeze(0)
        return bias

    def block(self, start: int, end: int) -> tuple[Tensor, int]:
        """The bias (1 or B, H or 1, end − start, end − first) of queries start..end−1 over
        keys first..end−1, and `first` (`first_key`)."""
        if self.full is not None:
            first = self.first_key(start)
            return self.full[:, :, start:end, first:end], first
        return self._build(start, end), self.first_key(start)


def masked_keys(
    index: Tensor, start: int, end: int, first: int = 0, window: int | None = None
) -> Tensor:
    """(end − start, end − first) True where query start..end−1 may not see key first..end−1:
    a later token, or one `window` or more tokens back."""
    queries, keys = index[start:end, None], index[None, first:end]
    hidden = keys > queries
    if window is not None:
        hidden = hidden | (queries - keys >= window)
    return hidden


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    bias_fn: BiasFn | None = None,
    dropout_p: float = 0.0,
    block_size: int = 1024,
    bias: CausalBias | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """q, k, v: (B, H, T, D); positions: (T,) or (B, T). Returns (B, H, T, D). The bias comes
    prepared (`bias`, as the model passes it: it may also carry a decay and a window) or as a
    function of positions (`bias_fn`). `sinks` (H,): each head's sink logit, a zero key with
    a zero value in front of the keys (`with_sink`)."""
    if bias is None and (bias_fn is not None or sinks is not None):
        bias = CausalBias(bias_fn, positions, q.shape[1], q.dtype, block_size, full_bias_bytes=0)
    if bias is None:
        return sdpa(q, k, v, is_causal=True, dropout_p=dropout_p)
    seq_len = q.shape[-2]
    if bias.block_size < seq_len:
        # q, k, v arrive as transposed views; one copy here spares SDPA a copy of the growing
        # key/value prefix for every block
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    outputs = []
    for start in range(0, seq_len, bias.block_size):
        end = min(start + bias.block_size, seq_len)
        mask, first = bias.block(start, end)
        keys, values = k[:, :, first:end], v[:, :, first:end]
        if sinks is not None:
            mask, keys, values = with_sink(mask, keys, values, sinks)
        outputs.append(sdpa(q[:, :, start:end], keys, values, attn_mask=mask, dropout_p=dropout_p))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def sdpa(q: Tensor, k: Tensor, v: Tensor, **options: Any) -> Tensor:
    """`scaled_dot_product_attention`, run in fp32 where that is faster: a bf16 step that needs
    gradients on a CPU. There torch's bf16 kernels (flash, and math with a bias) take 1.7-2.5x
    the fp32 kernel's time forward + backward (B=32, H=4, T=128, D=64, one thread; measured on
    a Xeon with AMX and an EPYC with avx512_bf16, docs/benchmarks.md), while forward alone the
    bf16 kernel is faster, so evaluation keeps it. fp32 inside is also the more exact: a bias
    already rounded to bf16 keeps its values, and the output is rounded to bf16 once."""
    if not (q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad):
        return F.scaled_dot_product_attention(q, k, v, **options)
    mask = options.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        options["attn_mask"] = mask.float()
    with torch.autocast(device_type="cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options)
    return out.to(q.dtype)


def with_sink(
    mask: Tensor, keys: Tensor, values: Tensor, sinks: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """A block's bias, keys and values with the sink in front: a zero key (its q·k is 0, so its
    score is the bias column, the head's sink logit) with a zero value. Softmax then divides by
    Σ_j e^{s_ij} + e^{sink}: gpt-oss's softmax over [scores, sink] with the sink's weight
    dropped."""
    # the mask keeps its own batch (1 when shared: SDPA broadcasts it), as CausalBias sized it
    batch, heads = mask.shape[0], keys.shape[1]
    mask = mask.expand(batch, heads, *mask.shape[-2:])
    column = sinks.to(mask.dtype)[None, :, None, None].expand(batch, heads, mask.shape[-2], 1)
    # q·k and the values may differ in width (PoPE's keys are twice the values' dims)
    keys = torch.cat([keys.new_zeros(*keys.shape[:2], 1, keys.shape[-1]), keys], dim=2)
    values = torch.cat([values.new_zeros(*values.shape[:2], 1, values.shape[-1]), values], dim=2)
    return torch.cat([column, mask], dim=-1), keys, values


def decay_attention(q: Tensor, k: Tensor, v: Tensor, decay: Tensor) -> Tensor:
    """Causal attention with a data-dependent decay c (B, H, T) (the score bias c_i − c_j) in
    one fused SDPA call in fp32, with no (T, T) bias.

    Softmax does not change when a query's scores all move by one constant, so c_i drops out
    and the bias is −c_j, a term of each key alone. It rides along as one extra head
    dimension: each key carries −c_j / scale and each query a 1, so the kernel's
    scale · (q·k + 1·(−c_j / scale)) is the biased score, and the gradient of c comes out of the
    kernel's key gradient. The call runs in fp32 whatever autocast says: c grows with the
    length, and a bf16 key (or key gradient) would round it by |c|/512; in fp32 a score carries
    |c_j|·2⁻²⁴ of rounding, below a bf16 score's own. On a CPU the fp32 flash kernel is also
    faster than the math kernel a (T, T) bias with a gradient sends bf16 to.
    """
    head_dim = q.shape[-1]
    scale = head_dim**-0.5
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = q.float(), k.float(), v.float()
        width = head_dim + 1
        if q.device.type == "cuda":  # the fused CUDA kernels want a head size divisible by 8
            width += -width % 8
        pad = width - head_dim - 1
        queries = F.pad(torch.cat([q, q.new_ones(*q.shape[:-1], 1)], dim=-1), (0, pad))
        keys = F.pad(torch.cat([k, (-decay.float() / scale)[..., None]], dim=-1), (0, pad))
        values = F.pad(v, (0, width - head_dim))
        out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale)
    return out[..., :head_dim]


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=False compiles one variant per shape: every evaluation length, and a last short
    # batch, adds one. Past dynamo's recompile limit (8 by default) the call runs eagerly from
    # then on, and eager FlexAttention materialises every score: an evaluation sweep over
    # lengths and modes can reach the limit, so it is raised here (never lowered)
    dynamo = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    setattr(dynamo, limit, max(getattr(dynamo, limit), 64))
    return torch.compile(flex_attention, dynamic=False)


def _flex_kernel(device_type: str) -> Callable:
    if device_type == "cuda":
        return _compiled_flex_attention()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention  # eager: a reference path for tests on CPUs


def flex_block_mask(seq_len: int, window: int | None, device: torch.device) -> Any:
    """FlexAttention's causal block mask over `seq_len` tokens, with a sliding window if any:
    it depends on the length and the window only, so a forward builds each one once."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx >= kv_idx

    def sliding(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    visible = causal if window is None else sliding
    return create_block_mask(visible, None, None, seq_len, seq_len, device=device)


class FlexMask:
    """The block mask (causal, with a sliding window if any) and the score_mod of one forward,
    or of one layer when the layers differ (a per-layer bias, a decay, a window); `block_masks`
    caches the block masks of one forward by window."""

    def __init__(
        self,
        score_bias: ScoreBias | Tensor | None,
        positions_fp32: Tensor,
        position_axes: int = 0,
        decay: Tensor | None = None,
        window: int | None = None,
        block_masks: dict[int | None, Any] | None = None,
    ) -> None:
        """`score_bias`: the scheme's bias as a function of (head, q position, k position), or
        its dense table ((H, T, T) or (B, H, T, T)) where the scheme has no form FlexAttention can
        differentiate (`PositionalScheme.flex_score_bias`)."""
        if not flex_available():
            raise ConfigError("attention=flex needs torch >= 2.5; use attention=sdpa")
        # positions are (…, T), or (…, T, A) for a scheme of A position axes
        seq_len = positions_fp32.shape[-2] if position_axes else positions_fp32.shape[-1]
        block_masks = {} if block_masks is None else block_masks
        if window not in block_masks:
            block_masks[window] = flex_block_mask(seq_len, window, positions_fp32.device)
        self.block_mask = block_masks[window]
        batched = positions_fp32.dim() == (3 if position_axes else 2)  # per sequence
        pos = positions_fp32 if batched else positions_fp32[None]
        # Compiled FlexAttention differentiates a captured tensor only where the score_mod
        # indexes it once, directly (its backward scatters the gradient straight out): the
        # decay is read twice, so the keys read a copy; a learnable bias comes as tensors
        # prepared outside (flex_score_bias), or as one dense table
        decay_q = decay.float() if decay is not None else None  # (B, H, T): c_i − c_j
        decay_k = decay_q.clone() if decay_q is not None and decay_q.requires_grad else decay_q
        table = score_bias if isinstance(score_bias, Tensor) else None
        table_batched = table is not None and table.dim() == 4

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            if table is not None:
                entry = table[b, h, q_idx, kv_idx] if table_batched else table[h, q_idx, kv_idx]
                score = score + entry.to(score.dtype)
            elif score_bias is not None:
                row = pos[b] if batched else pos[0]
                score = score + score_bias(h, row[q_idx], row[kv_idx]).to(score.dtype)
            if decay_q is not None:
                score = score + (decay_q[b, h, q_idx] - decay_k[b, h, kv_idx]).to(score.dtype)
            return score

        self.score_mod = score_mod if score_bias is not None or decay is not None else None


def flex_causal_attention(q: Tensor, k: Tensor, v: Tensor, mask: FlexMask) -> Tensor:
    kernel = _flex_kernel(q.device.type)
    return kernel(q, k, v, score_mod=mask.score_mod, block_mask=mask.block_mask)


# what the model hands every layer's attention for one forward (None: plain causal)
AttentionBias = CausalBias | FlexMask | None


def check_windows(window: Any) -> tuple[int | None, ...] | int | None:
    """attention.window: null (every key), a number of keys (every layer), or a list with one
    entry per layer (null for a global layer), checked here; the list's length is checked
    against the model when it is built."""
    one = integer(1, null=True)
    if (
        isinstance(window, list | tuple)
        or hasattr(window, "__len__")
        and not isinstance(window, str)
    ):
        windows = tuple(window)
        for entry in windows:
            require("attention.window", entry, one)
        if not windows:
            raise ConfigError("attention.window=[]; give one window per layer, or null")
        return windows
    require("attention.window", window, one)
    return window


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
    serves_sinks: bool = False  # model.sinks: a learned sink logit per head in the softmax

    def __init__(self, block_size: int = 1024, window: Any = None) -> None:
        require("attention.block_size", block_size, integer(1))
        self.block_size = block_size
        self.window = check_windows(window)
        self.sinks = False  # set by `check`: the model's layers hand it sink logits

    @classmethod
    def row_label(cls, options: dict[str, Any]) -> str:
        """What result tables add to a model's name for this kernel and its options: a sliding
        window, else nothing for a softmax kernel (they compute the same function)."""
        window = options.get("window")
        if window is None:
            return ""
        if isinstance(window, list | tuple):
            return "window " + "/".join("global" if w is None else str(w) for w in window)
        return f"window {window}"

    def window_of(self, layer: int) -> int | None:
        """The sliding window of a layer (None: every earlier key)."""
        if isinstance(self.window, tuple):
            return self.window[layer % len(self.window)]
        return self.window

    def check_sinks(self, sinks: bool) -> None:
        self.sinks = sinks
        if sinks and not self.serves_sinks:
            raise ConfigError(
                f"model.sinks=true: attention={self.name} cannot add a sink key (FlexAttention's "
                "score_mod adds no key; linear and stick-breaking attention have no softmax); "
                "use attention=sdpa or attention=blockwise, or set model.sinks=false"
            )

    def check(self, pos: Any, dropout: float, sinks: bool = False) -> None:
        """An impossible pairing is a one-line error when the model is built."""
        self.check_sinks(sinks)
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
        if isinstance(self.window, tuple) and len(self.window) != pos.n_layer:
            raise ConfigError(
                f"attention.window has {len(self.window)} entries for a model of "
                f"{pos.n_layer} layers; give one per layer (null: a global layer)"
            )

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        """Per-forward state shared by the layers (a bias, a mask); None by default."""
        return None

    def decoder(self) -> Blockwise | None:
        """The kernel that attends from new queries over cached keys (generation with a
        key/value cache, model/gpt.py KVCache): the blockwise reference computation of this
        kernel's function (`Blockwise.weights` for a block of queries at the end), with this
        kernel's window. None: a kernel whose function has no such form here (linear
        attention keeps a running state instead)."""
        if not self.softmax:
            return None
        if getattr(self, "_decoder", None) is None:
            self._decoder = Blockwise(self.block_size, self.window)
        return self._decoder

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
        decay: Tensor | None = None,
        sinks: Tensor | None = None,
        data: Any = None,
    ) -> Tensor:
        """One layer's attention. `decay` (B, H, T): a data-dependent score bias c_i − c_j of
        this layer (FoX), None for every other scheme. `sinks` (H,): this layer's sink logits
        (model.sinks), None without sinks. `data`: what the scheme read from this layer's input
        for its score hook (`layer_data`: PaTH, GRAPE), None for every other scheme."""
        raise NotImplementedError


def _bias_fn(pos: Any, layer: int) -> BiasFn:
    return functools.partial(pos.attention_bias, layer=pos.layer_index(layer))


def _shared(pos: Any, kernel: AttentionKernel) -> bool:
    """Whether one bias (mask) serves every layer: the same bias, no decay, the same window."""
    uniform_window = not isinstance(kernel.window, tuple)
    return not pos.per_layer and pos.needs != "decay" and uniform_window


class SDPA(AttentionKernel):
    name = "sdpa"
    serves = ("nothing", "decay", "bias")
    serves_sinks = True

    def __init__(
        self, block_size: int = 1024, full_bias_mib: float = 256, window: Any = None
    ) -> None:
        super().__init__(block_size, window)
        # a size in MiB: 0 builds the bias per block always; a negative size means nothing
        require("attention.full_bias_mib", full_bias_mib, number(ge=0))
        self.full_bias_bytes = int(full_bias_mib * 2**20)

    def _bias(
        self, pos: Any, prepared: Any, dtype: torch.dtype, layer: int, decay: Tensor | None = None
    ) -> CausalBias | None:
        needs, window = pos.layer_needs(layer), self.window_of(layer)
        if needs == "nothing" and decay is None and window is None and not self.sinks:
            return None  # plain causal attention: the flash kernel (a sink is a bias column)
        return CausalBias(
            _bias_fn(pos, layer) if needs == "bias" else None,
            prepared.fp32,
            pos.n_head,
            compute_dtype(dtype, prepared.fp32.device.type),
            self.block_size,
            self.full_bias_bytes,
            decay=decay,
            window=window,
        )

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        if _shared(pos, self):  # one bias for every layer
            return self._bias(pos, prepared, dtype, 0)
        return None

    def _decay_as_key(
        self, q: Tensor, pos: Any, layer: int, dropout_p: float, decay: Tensor | None
    ) -> bool:
        """Whether `decay_attention` serves this call: a decay alone (no bias, no window), no
        dropout, and a device where its fp32 kernel was measured faster than the bias (a CPU;
        on a GPU, fp32 only, until a GPU times it against bf16 with the bias)."""
        if decay is None or pos.layer_needs(layer) == "bias" or self.window_of(layer) is not None:
            return False
        fp32 = compute_dtype(q.dtype, q.device.type) == torch.float32
        return dropout_p == 0 and (q.device.type == "cpu" or fp32)

    def __call__(
        self, q, k, v, pos, prepared, state, layer, dropout_p, decay=None, sinks=None, data=None
    ):  # noqa: ANN001
        if sinks is None and self._decay_as_key(q, pos, layer, dropout_p, decay):
            # a decay alone (FoX): the fused kernel with −c_j as a key dimension, no (T, T) bias
            return decay_attention(q, k, v, decay).to(compute_dtype(q.dtype, q.device.type))
        bias = state if _shared(pos, self) else self._bias(pos, prepared, q.dtype, layer, decay)
        return causal_attention(q, k, v, prepared.fp32, dropout_p=dropout_p, bias=bias, sinks=sinks)


class Blockwise(AttentionKernel):
    name = "blockwise"
    serves = NEEDS
    serves_sinks = True

    def scores(
        self,
        q: Tensor,
        k: Tensor,
        pos: Any,
        prepared: Any,
        layer: int,
        start: int,
        end: int,
        decay: Tensor | None = None,
        data: Any = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        """fp32 scores (B or 1, H, end − start, end) of queries start..end−1 over keys
        0..end−1, every scheme hook applied, hidden keys at −inf. `padding` (B, ≥ end), True
        at the left padding of a batch of unequal sequences: those keys are hidden too, except
        from themselves (a padding query sees its own key, so no row is empty)."""
        seq_len, scale = q.shape[-2], q.shape[-1] ** -0.5
        index = torch.arange(seq_len, device=q.device)
        positions = prepared.fp32
        q_block = q[:, :, start:end]
        needs = pos.layer_needs(layer)
        with torch.autocast(device_type=q.device.type, enabled=False):
            q_block, keys = q_block.float(), k[:, :, :end].float()
            scores = (q_block @ keys.transpose(-1, -2)) * scale
            future = masked_keys(index, start, end, 0, self.window_of(layer))
            if needs == "bias":
                # (H, Tq, Tk), or (B, H, Tq, Tk) for per-sequence positions: broadcasts
                scores = scores + _bias_fn(pos, layer)(
                    positions[..., start:end], positions[..., :end]
                )
            elif needs == "scores":
                scores = pos.modify_scores(
                    scores,
                    q_block,
                    keys,
                    future,
                    positions[..., start:end],
                    positions[..., :end],
                    layer,
                    data,
                )
            if decay is not None:
                decay = decay.float()
                scores = scores + decay[..., start:end, None] - decay[..., None, :end]
            if padding is not None:  # after the hooks: they see the causal mask they know
                itself = index[start:end, None] == index[None, :end]
                future = future | (padding[:, None, None, :end] & ~itself)
            return scores.masked_fill(future, float("-inf"))

    def weights(
        self,
        q: Tensor,
        k: Tensor,
        pos: Any,
        prepared: Any,
        layer: int,
        start: int,
        end: int,
        decay: Tensor | None = None,
        sinks: Tensor | None = None,
        data: Any = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        """fp32 attention probabilities (B or 1, H, end − start, end) of queries start..end−1
        over keys 0..end−1, every scheme hook applied: the reference definition of attention
        (also used by analysis tools that look at the weights). With `sinks` (H,) the softmax
        runs over the scores and each head's sink logit, and the sink's weight is dropped: a
        row then sums to less than 1. `padding`: as `scores`."""
        scores = self.scores(q, k, pos, prepared, layer, start, end, decay, data, padding)
        return self.probabilities(scores, start, sinks)

    def probabilities(self, scores: Tensor, start: int, sinks: Tensor | None = None) -> Tensor:
        """fp32 scores (…, end − start, end) of queries start..end−1, hidden keys at −inf ->
        their attention weights: a softmax (over the sink logit too, with `sinks`)."""
        with torch.autocast(device_type=scores.device.type, enabled=False):
            if sinks is None:
                return torch.softmax(scores, dim=-1)
            column = sinks.float()[:, None, None].expand(*scores.shape[:-1], 1)
            return torch.softmax(torch.cat([column, scores], dim=-1), dim=-1)[..., 1:]

    def decoder(self) -> Blockwise:
        return self  # stick-breaking too: its own weights

    def decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pos: Any,
        prepared: Any,
        layer: int,
        decay: Tensor | None = None,
        sinks: Tensor | None = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        """The attention (B, H, Tq, D) of the last Tq queries `q` over every key `k`, `v`
        (B, H, Tk, ·), Tk ≥ Tq, at the positions of `prepared` (all Tk tokens): what
        `__call__` gives for those rows, computed for them alone. `padding` (B, Tk): the keys
        of a batch's left padding, hidden (`scores`)."""
        start, end = k.shape[-2] - q.shape[-2], k.shape[-2]
        rows = q.new_zeros(*q.shape[:2], end, q.shape[-1])  # `scores` reads rows start..end−1
        rows[:, :, start:] = q
        weights = self.weights(
            rows, k, pos, prepared, layer, start, end, decay, sinks, padding=padding
        )
        return weights.to(v.dtype) @ v

    def __call__(
        self, q, k, v, pos, prepared, state, layer, dropout_p, decay=None, sinks=None, data=None
    ):  # noqa: ANN001
        plain = decay is None and sinks is None and dropout_p == 0 and self.window_of(layer) is None
        fused = pos.attend(q, k, v, data, layer) if plain and self.softmax else None
        if fused is not None:  # the scheme's own kernel (PaTH's fla kernel on a GPU)
            return fused
        seq_len = q.shape[-2]
        outputs = []
        for start in range(0, seq_len, self.block_size):
            end = min(start + self.block_size, seq_len)
            weights = self.weights(q, k, pos, prepared, layer, start, end, decay, sinks, data)
            weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
            outputs.append(weights.to(v.dtype) @ v[:, :, :end])
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


class StickBreaking(Blockwise):
    """`attention=stick_breaking` (Tan et al., ICLR 2025): softmax replaced by stick-breaking.

    Query i gives key j the weight A_ij = β_ij · Π_{j<l<i} (1 − β_il), β = σ(z), z the scaled
    score: the nearest key breaks the stick first, so the weights fall with distance by what
    the keys between say, with no positional encoding (use pos=nope) and weights summing to at
    most 1 (the rest of the stick is dropped). Computed in log space in fp32 like the naive
    reference (fla-org/flash-linear-attention, stickbreaking_attn/naive.py): log A_ij =
    log σ(z_ij) + Σ_{l>j} log σ(−z_il) over the visible keys, a reverse cumulative sum along
    the keys of each query block. `attend_current`: whether a query also sees its own key
    (the reference's default, false, leaves the first token's attention output at 0; with a
    window W the query then sees the W − 1 keys before it).
    A scheme's score hooks (bias, scores) apply to z, before the sigmoid."""

    name = "stick_breaking"
    serves = ("nothing", "decay", "bias")
    serves_sinks = False  # no softmax: the stick's rest is already attention to nothing
    softmax = False

    def __init__(
        self, block_size: int = 512, attend_current: bool = False, window: Any = None
    ) -> None:
        super().__init__(block_size, window)
        require("attention.attend_current", attend_current, boolean())
        self.attend_current = attend_current

    @classmethod
    def row_label(cls, options: dict[str, Any]) -> str:
        window = super().row_label(options)
        return "stick-breaking" + (f", {window}" if window else "")

    def check(self, pos: Any, dropout: float, sinks: bool = False) -> None:
        super().check(pos, dropout, sinks)
        windows = self.window if isinstance(self.window, tuple) else (self.window,)
        if not self.attend_current and 1 in windows:
            raise ConfigError(
                "attention.window=1 with attention.attend_current=false leaves stick-breaking "
                "no key to attend to; widen the window or set attention.attend_current=true"
            )

    def probabilities(self, scores: Tensor, start: int, sinks: Tensor | None = None) -> Tensor:
        """The stick-breaking weights of the scores z (sinks: refused by `check_sinks`)."""
        z, end = scores, scores.shape[-1]
        with torch.autocast(device_type=z.device.type, enabled=False):
            visible = torch.isfinite(z)
            if not self.attend_current:  # the diagonal: key start + r for query row r
                rows = torch.arange(end - start, device=z.device)
                visible[..., rows, rows + start] = False
            z = z.masked_fill(~visible, 0.0)
            log_rest = F.logsigmoid(-z).masked_fill(~visible, 0.0)  # log(1 − β), 0 if hidden
            after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # Σ_{l>j} log(1 − β_il)
            log_weights = F.logsigmoid(z) + after
            return log_weights.masked_fill(~visible, float("-inf")).exp()


class Flex(AttentionKernel):
    name = "flex"
    serves = ("nothing", "decay", "bias")
    trains_on_cpu = False  # FlexAttention has no backward pass on CPUs
    has_dropout = False

    def _mask(
        self,
        pos: Any,
        prepared: Any,
        layer: int,
        decay: Tensor | None = None,
        block_masks: dict[int | None, Any] | None = None,
    ) -> FlexMask:
        score_bias = _flex_bias(pos, prepared, layer) if pos.layer_needs(layer) == "bias" else None
        window = self.window_of(layer)
        return FlexMask(score_bias, prepared.fp32, pos.position_axes, decay, window, block_masks)

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        # one mask for every layer, or the block masks that the layers of this forward share
        return self._mask(pos, prepared, 0) if _shared(pos, self) else {}

    def __call__(
        self, q, k, v, pos, prepared, state, layer, dropout_p, decay=None, sinks=None, data=None
    ):  # noqa: ANN001
        if isinstance(state, FlexMask):  # shared by every layer
            return flex_causal_attention(q, k, v, state)
        cache = state if isinstance(state, dict) else None
        return flex_causal_attention(q, k, v, self._mask(pos, prepared, layer, decay, cache))


_AUTO_SAID: set[tuple[str, str]] = set()


class Auto(AttentionKernel):
    """The default: sdpa where it can serve the scheme (the fast path), else blockwise (schemes
    that need the scores). The choice is made, and logged, when the model is built."""

    name = "auto"
    serves = NEEDS
    serves_sinks = True  # sdpa and blockwise both do

    def __init__(
        self, block_size: int = 1024, full_bias_mib: float = 256, window: Any = None
    ) -> None:
        super().__init__(block_size, window)
        require("attention.full_bias_mib", full_bias_mib, number(ge=0))  # at once, not at check()
        self.options = {"block_size": block_size, "full_bias_mib": full_bias_mib, "window": window}
        self.chosen: AttentionKernel | None = None

    def check(self, pos: Any, dropout: float, sinks: bool = False) -> None:
        if pos.needs in SDPA.serves:
            self.chosen = SDPA(**self.options)
        else:
            self.chosen = Blockwise(self.options["block_size"], self.options["window"])
        said = (self.chosen.name, type(pos).__name__)
        if said not in _AUTO_SAID:  # once per process: a run builds its model more than once
            _AUTO_SAID.add(said)
            log.info("attention=auto -> %s for %s", *said)
        self.chosen.check(pos, dropout, sinks)

    def begin(self, pos: Any, prepared: Any, dtype: torch.dtype) -> Any:
        return self.chosen.begin(pos, prepared, dtype)

    def decoder(self) -> Blockwise | None:
        return self.chosen.decoder()

    def __call__(
        self, q, k, v, pos, prepared, state, layer, dropout_p, decay=None, sinks=None, data=None
    ):  # noqa: ANN001
        return self.chosen(q, k, v, pos, prepared, state, layer, dropout_p, decay, sinks, data)


def _flex_bias(pos: Any, prepared: Any, layer: int) -> ScoreBias | Tensor:
    """A layer's bias as FlexAttention's score_mod reads it: the scheme's own pointwise form, or
    the dense table ((H, T, T) or (B, H, T, T)) of its `attention_bias` where it has none."""
    layer = pos.layer_index(layer)
    score_bias = pos.flex_score_bias(layer)
    if score_bias is not None:
        return score_bias
    with torch.autocast(device_type=prepared.fp32.device.type, enabled=False):
        return pos.attention_bias(prepared.fp32, prepared.fp32, layer).float()


def kernel_from_legacy(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """The attention config of a checkpoint written before `attention=` was a config group
    (model.attention, model.attn_block_size)."""
    name = model_cfg.get("attention", "auto")
    target = {"auto": Auto, "sdpa": SDPA, "blockwise": Blockwise, "flex": Flex}[name]
    return {
        "_target_": f"{__name__}.{target.__name__}",
        "block_size": model_cfg.get("attn_block_size", 1024),
    }
