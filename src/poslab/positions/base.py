"""The one interface every positional scheme implements.

A scheme can act in four places; the model calls every hook for every scheme, never its name:

1. ``embed``: add a vector to the token embeddings (learned, sinusoidal);
2. ``rotate``: transform queries and keys given their positions (rotary, xPos);
3. ``score_bias`` / ``attention_bias``: a bias added to the attention scores as a function of
   query and key positions (ALiBi, T5, KERPLE, FIRE, Sandwich);
4. ``modify_scores``: a change of the scores that needs the queries and the scores themselves
   (CoPE);
5. ``data_decay``: a data-dependent bias c_i − c_j from the layer's input, c (B, H, T) a cumulative
   sum per token (FoX's log forget gates);
6. ``layer_data``: what ``modify_scores`` reads from the layer's input besides q and k (PaTH's
   Householder vectors, GRAPE's positional features), handed to it as ``data``; and ``attend``,
   a scheme's own fused kernel for the whole attention where one is installed (PaTH's fla
   Triton kernel on a GPU), which the blockwise kernel prefers when it returns a result.

A scheme declares what it needs from the attention kernel in ``needs``: ``"nothing"`` (hooks 1–2
only), ``"decay"`` (hook 5), ``"bias"`` (hook 3) or ``"scores"`` (hook 4). Each kernel
(poslab.model.attention) says what it can serve, and an impossible pairing is a ConfigError when the
model is built. A scheme whose layers differ (a per-layer schedule) needs per layer what
``layer_needs`` says, and as a whole the most demanding of those.

Every hook gets the layer index, so a scheme may keep parameters per layer (``per_layer``) or
share them. Positions are explicit tensors, ``(T,)`` shared by the batch or ``(B, T)`` per
sequence (randomized positions draw one set per sequence); a scheme over several axes sets
``position_axes`` and takes ``(…, T, A)``. There is no maximum length anywhere: positions are
computed on the fly, and in fp32 whatever the autocast dtype (bf16 cannot represent every
integer above 256).

Work that depends on the positions alone (fp32 positions, rotary cos/sin) is done once per
forward by ``prepare``; the model hands its result to the hooks of every layer. The hooks also
accept raw positions (they prepare them themselves), which is convenient in tests and notebooks.

Derived state (a fixed θ, ALiBi's slopes, caches) lives in non-persistent buffers rebuilt from the
config, so an eval-time option change (``eval.pos_overrides``) takes effect; only trainable
parameters are saved in checkpoints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import integer, require
from poslab.errors import ConfigError

NEEDS = ("nothing", "decay", "bias", "scores")  # as poslab.model.attention.NEEDS
POSITION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Prepared:
    """What the hooks of one forward need, computed once, not once per layer."""

    positions: Tensor  # (T,) or (B, T) [+ (A,) for multi-axis schemes], as given
    fp32: Tensor  # the same, float32, computed outside autocast
    extra: dict[str, Any] = field(default_factory=dict)  # the scheme's own (rotary cos/sin)


class PositionalScheme(nn.Module):
    """Base class: the identity for every hook (which is exactly the `nope` scheme).

    Options every scheme takes (besides its own): ``n_layer`` (for per-layer parameters),
    ``randomize_max`` (Ruoss et al. 2023: train on a sorted random subset of [0, N) instead of
    0..L−1, a new draw per sequence; evaluation uses 0..T−1) and ``position_dtype`` (``fp32``;
    ``bf16`` reproduces on purpose the bug of implementations that computed positions in bf16,
    where integers above 256 collide: an ablation, never a default)."""

    needs: ClassVar[str] = "nothing"  # what the attention kernel must provide (NEEDS)
    reads_positions: ClassVar[bool] = True  # False: positions change nothing (nope)
    position_axes: ClassVar[int] = 0  # 0: one position per token; A: (…, T, A)
    # True: attention depends on positions only through m − n, so shifting every position by the
    # same offset changes nothing (the property tests check it, or check that the offset shows)
    shift_invariant: ClassVar[bool] = False
    # True: `rotate` returns q and k of more dims than the values (PoPE's 2 × head_dim, real and
    # imaginary parts); a kernel that needs q and k as wide as v (linear attention) refuses it
    widens_keys: ClassVar[bool] = False
    # True: DroPE may drop it (`train.py extend=RUN pos=nope`): a rotary embedding of one
    # position axis, which leaves weights a NoPE model can take unchanged
    droppable: ClassVar[bool] = False

    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_layer: int = 1,
        randomize_max: int | None = None,
        position_dtype: str = "fp32",
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_head = n_head
        self.n_layer = n_layer
        self.head_dim = d_model // n_head
        self.per_layer = False  # schemes with per-layer parameters set it from their option
        require("pos.randomize_max", randomize_max, integer(1, null=True))
        if randomize_max is not None and not self.reads_positions:
            raise ConfigError(
                f"pos.randomize_max={randomize_max}: {type(self).__name__} reads no positions; "
                "set pos.randomize_max=null"
            )
        self.randomize_max = randomize_max
        if position_dtype not in POSITION_DTYPES:
            raise ConfigError(
                f"pos.position_dtype={position_dtype!r}; choose one of {tuple(POSITION_DTYPES)}"
            )
        self.position_dtype = position_dtype

    # -- positions -----------------------------------------------------------------------------

    def positions(self, batch: int, seq_len: int, device: torch.device) -> Tensor:
        """The positions of a forward without explicit ones: 0..T−1, shared by the batch; in
        training with randomize_max=N, a sorted random subset of [0, N) per sequence (B, T)."""
        if self.training and self.randomize_max is not None:
            self.max_training_position(seq_len)  # N ≥ T
            keys = torch.rand(batch, self.randomize_max, device=device)
            return keys.argsort(dim=1)[:, :seq_len].sort(dim=1).values
        return torch.arange(seq_len, device=device)

    def text_positions(self, positions: Tensor) -> Tensor:
        """Token positions (…, T) of text as this scheme takes them: as they are for one axis;
        a multi-axis scheme gives every axis the same id."""
        return positions

    def max_training_position(self, seq_len: int) -> int:
        """The largest position training shows the scheme."""
        if self.randomize_max is not None and self.randomize_max < seq_len:
            raise ConfigError(
                f"pos.randomize_max={self.randomize_max} is below the sequence length "
                f"{seq_len}; choose N ≥ data.seq_len (the papers use N ≫ L)"
            )
        return (self.randomize_max or seq_len) - 1

    def prepare(self, positions: Tensor) -> Prepared:
        """Positions -> what the hooks need; schemes extend it (rotary adds cos/sin)."""
        return Prepared(positions, self.position_values(positions))

    def position_values(self, positions: Tensor) -> Tensor:
        """Positions as the scheme computes with them: fp32 (exact below 2**24), or with
        position_dtype=bf16 rounded to bf16 first (the bug: 257 and 258 become 256 and 258)."""
        dtype = POSITION_DTYPES[self.position_dtype]
        return fp32_positions(positions).to(dtype).to(torch.float32)

    def prepared(self, positions: Tensor | Prepared) -> Prepared:
        return positions if isinstance(positions, Prepared) else self.prepare(positions)

    # -- the hooks -----------------------------------------------------------------------------

    def embed(self, x: Tensor, positions: Tensor | Prepared) -> Tensor:
        """Token embeddings (B, T, d_model) -> embeddings with position added."""
        return x

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Queries and keys (B, H, T, head_dim) -> transformed queries and keys."""
        return q, k

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, layer: int = 0) -> Tensor:
        """Additive score bias in fp32 for positions (…, Tq) and (…, Tk): (H, Tq, Tk), or
        (B, H, Tq, Tk) for per-sequence positions; built from `score_bias` unless a scheme has
        a faster form. Only called when needs == "bias"."""
        with torch.autocast(device_type=q_positions.device.type, enabled=False):
            heads = torch.arange(self.n_head, device=q_positions.device)
            q = self.position_values(q_positions)[..., None, :, None]
            k = self.position_values(k_positions)[..., None, None, :]
            return self.score_bias(heads[:, None, None], q, k, layer)

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        """The bias of a scheme with needs == "bias", elementwise for broadcastable integer
        head and fp32 position tensors: one definition serves the SDPA and blockwise kernels
        (through `attention_bias`) and FlexAttention's `score_mod`, which calls it with scalars."""
        raise NotImplementedError(f"{type(self).__name__} adds no attention bias")

    def flex_score_bias(self, layer: int = 0) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
        """`score_bias` of one layer in the form compiled FlexAttention can differentiate, or
        None for the dense table of `attention_bias` instead. That kernel's backward takes the
        gradient of a tensor the score_mod captured only where the score_mod indexes it once,
        directly: a learnable parameter that is first selected, clamped or read twice inside
        it fails to compile. A scheme with learnable parameters therefore prepares them here,
        once per forward, each indexed once in what it returns; the default is `score_bias`
        itself for a scheme with none, and the dense table for one that has some."""
        if any(p.requires_grad for p in self.parameters()):
            return None
        return functools.partial(self.score_bias, layer=layer)

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
        """For needs == "scores": the scaled fp32 scores (B, H, Tq, Tk) of queries q
        (B, H, Tq, D) over keys k (B, H, Tk, D) (as `rotate` left them, fp32), a block of queries
        at fp32 positions (…, Tq) over keys 0..Tk−1 at (…, Tk); `future` (Tq, Tk) marks the
        masked keys; `data`: what `layer_data` read from this layer's input -> new scores."""
        raise NotImplementedError(f"{type(self).__name__} does not change the scores")

    def layer_data(self, x: Tensor, layer: int = 0) -> Any:
        """For needs == "scores": what `modify_scores` needs from the layer's normalised input
        x (B, T, d_model) beyond q and k, computed once per layer and forward; None for
        schemes that read q and k alone."""
        return None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, data: Any, layer: int = 0) -> Tensor | None:
        """The causal softmax attention (B, H, T, D) of a layer by a fused kernel of the
        scheme's own, or None (the default) for the kernel's own computation from the hooks.
        The blockwise kernel asks only when nothing else enters the scores (no window, decay,
        sinks or dropout), so a fused kernel computes exactly what `modify_scores` defines."""
        return None

    def data_decay(self, x: Tensor, layer: int = 0) -> Tensor | None:
        """For needs == "decay": the layer's normalised input x (B, T, d_model) -> c (B, H, T)
        in fp32, the score bias of query i over key j being c_i − c_j; None for other schemes."""
        return None

    def layer_needs(self, layer: int) -> str:
        """What this layer needs from the kernel (a per-layer schedule differs by layer)."""
        return self.needs

    # -- checks and logs -----------------------------------------------------------------------

    def upgrade_state(self, state: dict[str, Tensor], prefix: str = "pos.") -> dict[str, Tensor]:
        """A checkpoint of an earlier version, made loadable: what is now derived state
        (non-persistent buffers such as a fixed θ or ALiBi's slopes) is dropped, so the values
        rebuilt from the config are used. Schemes whose parameters changed form extend it."""
        derived = {prefix + n for n, _ in self.named_buffers()} - {
            prefix + n for n in self.state_dict()
        }
        return {k: v for k, v in state.items() if k not in derived}

    def layer_index(self, layer: int) -> int:
        """Which parameter set a layer uses: its own with per_layer, else the shared one."""
        return layer if self.per_layer else 0

    def check_length(self, max_position: int) -> None:
        """Raise ConfigError if this scheme cannot represent positions up to `max_position`."""

    @property
    def reads_length(self) -> bool:
        """True when a token's treatment depends on the forward's length, not only on its own
        position (dynamic NTK's θ, xPos's centring, SSMax's log n): keys cached by an earlier
        forward would then differ from the whole sequence's, so generation keeps no cache."""
        return False

    @property
    def scales_scores(self) -> bool:
        """True when `rotate` also multiplies q or k by a temperature (an eval-time log-n or
        YaRN factor): meant for softmax scores, so linear attention refuses it."""
        return False

    def metrics(self) -> dict[str, Tensor]:
        """Scalars worth logging during training (e.g. how far a learnable θ moved)."""
        return {}

    def after_training(self, out: Any, run: str = "", seed: Any = None) -> list[Any]:
        """Files (plots of what the scheme learned) written into the folder `out` after
        training; the paths, which training also logs to W&B. None by default."""
        return []


COMBINES = ("add", "concat")


class AbsoluteEmbedding:
    """How an absolute scheme (learned, sinusoidal) joins its position vectors to the tokens:
    ``add`` (the usual sum, vectors of d_model dims) or ``concat`` (the token embedding's first
    d_model − p dims, then p position dims: concatenation, as Vaswani et al. and the seed
    articles discuss, inside the model's width, so the token embedding's last p dims are used
    only by the tied output layer). p = ``position_dims``, d_model/4 when null."""

    def __init__(self, d_model: int, combine: str, position_dims: int | None) -> None:
        if combine not in COMBINES:
            raise ConfigError(f"pos.combine={combine!r}; choose one of {COMBINES}")
        require("pos.position_dims", position_dims, integer(2, null=True))
        if combine == "add" and position_dims is not None:
            raise ConfigError(
                f"pos.position_dims={position_dims} applies to pos.combine=concat; set "
                "pos.position_dims=null or pos.combine=concat"
            )
        dims = d_model
        if combine == "concat":
            dims = position_dims if position_dims is not None else max(2, d_model // 4)
        if combine == "concat" and (dims % 2 or dims >= d_model):
            raise ConfigError(
                f"pos.position_dims={dims} must be even and below model.d_model={d_model} "
                "(the token keeps d_model − position_dims dims)"
            )
        self.combine = combine
        self.width = dims  # the dims of a position vector

    def join(self, x: Tensor, vectors: Tensor) -> Tensor:
        """Tokens x (B, T, d) with position vectors (…, T, width), in x's dtype."""
        vectors = vectors.to(x.dtype)
        if self.combine == "add":
            return x + vectors
        tokens = x[..., : x.shape[-1] - self.width]
        return torch.cat((tokens, vectors.expand(*tokens.shape[:-1], self.width)), dim=-1)

    def label(self) -> str:
        return f"concat {self.width} dims" if self.combine == "concat" else ""


def fp32_positions(positions: Tensor) -> Tensor:
    """Positions as fp32, outside autocast (exact for integers below 2**24)."""
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return positions.to(torch.float32)
