"""Perplexity at any length, in the two modes of the ALiBi paper's fairseq evaluation.

* ``nonoverlapping``: the split is cut into consecutive windows of L tokens, each scored from
  scratch (the paper's default "L_valid" evaluation).
* ``sliding``: windows of L tokens advance by ``stride``; each token is scored exactly once, by
  the first window that contains it after the previous window's end, so it sees up to
  L - stride tokens of context (every token of the first window sees less).

Both score every token of the split but the first (which has no preceding token), so all lengths
and both modes score the same tokens. Logits are computed only for scored tokens, in chunks fused
with the loss, so a 16k-token window never materialises a (16k × vocab) matrix.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from poslab.data.tokens import TokenizedSplit
from poslab.model.gpt import GPT
from poslab.model.losses import linear_token_nll

MODES = ("nonoverlapping", "sliding")


@dataclass
class Window:
    start: int  # first input token
    length: int  # input tokens (targets are the next `length` tokens)
    score_from: int  # targets before this index inside the window are context only


@dataclass
class ScoreResult:
    length: int
    mode: str
    stride: int
    tokens: int = 0
    windows: int = 0  # forward windows scored (the report's count, checked against the data)
    nll: float = 0.0  # summed over scored tokens, nats
    words: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bucket_size: int = 1
    bucket_nll: list[float] = field(default_factory=list)
    bucket_count: list[int] = field(default_factory=list)
    nll_per_window: list[float] = field(default_factory=list)  # per given window (windows=)
    # token_nll=True: each target's NLL by its index in the split (NaN where none was scored)
    token_nll: np.ndarray | None = None

    @property
    def loss(self) -> float:
        return self.nll / max(1, self.tokens)

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def word_ppl(self) -> float:
        return math.exp(min(self.nll / max(1, self.words), 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.nll / max(1, self.bytes) / math.log(2)

    def loss_by_position(self) -> list[tuple[int, float, int]]:
        """(first position of the bucket, mean loss, tokens) for every non-empty bucket."""
        return [
            (i * self.bucket_size, s / c, c)
            for i, (s, c) in enumerate(zip(self.bucket_nll, self.bucket_count, strict=True))
            if c
        ]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("token_nll")  # an array per token: the caller takes it from the result
        d.update(
            loss=self.loss,
            ppl=self.ppl,
            word_ppl=self.word_ppl,
            bits_per_byte=self.bits_per_byte,
            tokens_per_s=self.tokens / max(self.seconds, 1e-9),
        )
        return d


def make_windows(
    num_tokens: int, length: int, mode: str, stride: int | None = None
) -> list[Window]:
    """Windows over a split of `num_tokens` tokens; targets cover tokens 1 .. num_tokens-1 once."""
    last = num_tokens - 1  # the number of (input, target) pairs
    if mode == "nonoverlapping":
        return [Window(s, min(length, last - s), 0) for s in range(0, last, length)]
    if mode != "sliding":
        raise ValueError(f"mode={mode!r}; choose one of {MODES}")
    stride = stride or length
    if not 0 < stride <= length:
        raise ValueError(f"stride={stride} must be in [1, length={length}]")
    windows, scored_until = [], 0
    end = min(length, last)
    while True:
        start = max(0, end - length)
        windows.append(Window(start, end - start, scored_until - start))
        scored_until = end
        if end >= last:
            return windows
        end = min(end + stride, last)


# a length is scored over a split only when the split holds at least this many full windows of
# it: one window (or part of one) is a single context, not a perplexity at that length, and
# reading it as one gave a row at 1,000,000 tokens from 1,859 (issue #43)
MIN_FULL_WINDOWS = 4


def too_few_windows(num_tokens: int, length: int) -> str | None:
    """Why a split of `num_tokens` tokens cannot be scored at `length` (None: it can)."""
    full = (num_tokens - 1) // length
    if full >= MIN_FULL_WINDOWS:
        return None
    return (
        f"the {num_tokens:,} scored tokens hold {full} full window{'s' if full != 1 else ''} of "
        f"{length:,} (at least {MIN_FULL_WINDOWS}); raise eval.max_tokens or use a longer split"
    )


def default_batch_tokens(device: torch.device) -> int:
    """Tokens per forward pass when eval.batch_size is null: enough to keep a GPU busy; on a CPU
    small enough that activations stay in cache (measured fastest on 2 cores)."""
    return 65536 if device.type == "cuda" else 8192


def batched(windows: list[Window], batch_size: int) -> list[list[Window]]:
    """Batches of at most `batch_size` windows of equal length and equal context (one forward
    pass each)."""
    groups: dict[tuple[int, int], list[Window]] = {}
    for w in windows:
        groups.setdefault((w.length, w.score_from), []).append(w)
    return [g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


def window_nll(
    model: GPT,
    tokens: torch.Tensor,
    score_from: int,
    position_offset: int,
    autocast_dtype: torch.dtype | None,
) -> torch.Tensor:
    """(B, n − score_from) NLL of the targets of windows `tokens` (B, n + 1) from `score_from`."""
    device = tokens.device
    n = tokens.shape[1] - 1
    positions = model.pos.text_positions(
        torch.arange(position_offset, position_offset + n, device=device)
    )
    with torch.autocast(
        device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
    ):
        hidden = model.hidden_states(tokens[:, :-1], positions)
    # logits only where a target is scored (sliding windows: not for the context)
    return linear_token_nll(
        hidden[:, score_from:].float(), model.lm_head.weight, tokens[:, 1 + score_from :]
    )


@torch.inference_mode()  # no graph: evaluation at 16·L would otherwise keep every activation
def score(
    model: GPT,
    data: TokenizedSplit,
    length: int,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    batch_size: int | None = None,
    position_offset: int = 0,
    bucket_size: int = 64,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    windows: list[Window] | None = None,
    token_nll: bool = False,
) -> ScoreResult:
    """Token NLL of `model` over `data` at window length `length` (see module doc).

    Windows of equal length and equal context batch together; each batch is one forward pass,
    and logits are computed (in chunks, fused with the loss) only for the tokens it scores.
    `windows` replaces the mode's own (per-document evaluation: one window per document, laid
    end to end in `data`); then the result also holds each window's NLL (`nll_per_window`).
    `token_nll`: the result also holds every target's NLL by its index (context_use.py).
    """
    device = next(model.parameters()).device
    given = windows is not None
    windows = windows if given else make_windows(len(data.ids), length, mode, stride)
    batch_size = batch_size or max(1, default_batch_tokens(device) // length)
    result = ScoreResult(length=length, mode=mode, stride=stride or length, bucket_size=bucket_size)
    result.windows = len(windows)
    ids = torch.from_numpy(np.asarray(data.ids, dtype=np.int64))
    sums = _Sums(data, windows if given else None, token_nll, length, bucket_size, device)
    started = time.perf_counter()
    bar = tqdm(
        total=len(windows),
        desc=f"{mode} L={length}",
        unit="win",
        disable=None if progress else True,  # None: on a terminal only
        leave=False,
    )
    for batch in batched(windows, batch_size):
        n, score_from = batch[0].length, batch[0].score_from
        starts = torch.tensor([w.start for w in batch])
        tokens = ids[starts[:, None] + torch.arange(n + 1)].to(device, non_blocking=True)
        nll = window_nll(model, tokens, score_from, position_offset, autocast_dtype)
        sums.add(batch, starts, nll)
        bar.update(len(batch))
    bar.close()
    result.seconds = time.perf_counter() - started
    sums.into(result)
    return result


class _Sums:
    """What score() adds up over the batches, on the model's device (no sync per batch): the
    NLL per position bucket and in all, the scored targets' words and bytes, each given
    window's NLL (batches lose the windows' order) and, when asked, each target's NLL."""

    def __init__(
        self,
        data: TokenizedSplit,
        given: list[Window] | None,
        token_nll: bool,
        length: int,
        bucket_size: int,
        device: torch.device,
    ) -> None:
        n_buckets = math.ceil(length / bucket_size)
        self.bucket_size, self.device = bucket_size, device
        self.bucket_nll = torch.zeros(n_buckets, dtype=torch.float64, device=device)
        self.bucket_count = torch.zeros(n_buckets, dtype=torch.long, device=device)
        self.nll = torch.zeros((), dtype=torch.float64, device=device)
        self.tokens = self.words = self.bytes = 0
        # cumulative counts: the words (bytes) of targets lo..hi-1 are cum[hi] - cum[lo]
        self.cum_words = np.concatenate([[0], np.cumsum(np.asarray(data.words, dtype=np.int64))])
        self.cum_bytes = np.concatenate([[0], np.cumsum(np.asarray(data.bytes, dtype=np.int64))])
        self.index = {id(w): i for i, w in enumerate(given)} if given is not None else None
        self.per_window = torch.zeros(len(given or ()), dtype=torch.float64, device=device)
        targets = max(0, len(data.ids) - 1) if token_nll else 0
        self.per_token = torch.full((targets,), float("nan"), device=device) if token_nll else None

    def add(self, batch: list[Window], starts: torch.Tensor, nll: torch.Tensor) -> None:
        n, score_from, device = batch[0].length, batch[0].score_from, self.device
        if self.index is not None:
            where_windows = torch.tensor([self.index[id(w)] for w in batch], device=device)
            self.per_window[where_windows] = nll.sum(1, dtype=torch.float64)
        where = torch.arange(score_from, n, device=device) // self.bucket_size
        self.bucket_nll.index_add_(0, where, nll.sum(0, dtype=torch.float64))
        self.bucket_count.index_add_(0, where, torch.full_like(where, len(batch)))
        self.nll += nll.sum(dtype=torch.float64)
        if self.per_token is not None:  # target j of a window is the split's target start + j
            targets = starts[:, None] + torch.arange(score_from, n)
            self.per_token[targets.to(device).flatten()] = nll.float().flatten()
        self.tokens += (n - score_from) * len(batch)
        # target j of a window is token start + 1 + j of the split
        first = starts.numpy() + 1
        lo, hi = first + score_from, first + n
        self.words += int((self.cum_words[hi] - self.cum_words[lo]).sum())
        self.bytes += int((self.cum_bytes[hi] - self.cum_bytes[lo]).sum())

    def into(self, result: ScoreResult) -> None:
        result.nll = float(self.nll)
        result.tokens, result.words, result.bytes = self.tokens, self.words, self.bytes
        result.bucket_nll = self.bucket_nll.tolist()
        result.bucket_count = self.bucket_count.tolist()
        result.nll_per_window = self.per_window.tolist()
        if self.per_token is not None:
            result.token_nll = self.per_token.cpu().numpy()
