"""Perplexity at any length, in the two modes of the ALiBi paper's fairseq evaluation.

* ``nonoverlapping``: the split is cut into consecutive windows of L tokens, each scored from
  scratch (the paper's default "L_valid" evaluation).
* ``sliding``: windows of L tokens advance by ``stride``; each token is scored exactly once, by
  the first window that contains it after the previous window's end, so it sees up to
  L - stride tokens of context (every token of the first window sees less).

Both score every token of the split but the first (which has no preceding token), so all lengths
and both modes score the same tokens. Logits are computed in chunks of the sequence, so a 16k-token
window never materialises a (16k × vocab) matrix.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from poslab.data import TokenizedSplit
from poslab.model import GPT

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
    nll: float = 0.0  # summed over scored tokens, nats
    words: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bucket_size: int = 1
    bucket_nll: list[float] = field(default_factory=list)
    bucket_count: list[int] = field(default_factory=list)

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


@torch.no_grad()
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
    logits_chunk_tokens: int = 8192,
    progress: bool = True,
) -> ScoreResult:
    """Token NLL of `model` over `data` at window length `length` (see module doc)."""
    device = next(model.parameters()).device
    windows = make_windows(len(data.ids), length, mode, stride)
    batch_size = batch_size or max(1, 16384 // length)
    result = ScoreResult(length=length, mode=mode, stride=stride or length, bucket_size=bucket_size)
    n_buckets = math.ceil(length / bucket_size)
    bucket_nll = torch.zeros(n_buckets, dtype=torch.float64)
    bucket_count = torch.zeros(n_buckets, dtype=torch.long)
    words = np.asarray(data.words)
    nbytes = np.asarray(data.bytes)
    ids = np.asarray(data.ids)
    # equal-length windows batch together; the short tail window goes alone
    groups: dict[int, list[Window]] = {}
    for w in windows:
        groups.setdefault(w.length, []).append(w)
    batches = [g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
    started = time.perf_counter()
    bar = tqdm(
        total=len(windows), desc=f"{mode} L={length}", unit="win", disable=not progress, leave=False
    )
    for batch in batches:
        n = batch[0].length
        chunk = np.stack([ids[w.start : w.start + n + 1] for w in batch]).astype(np.int64)
        tokens = torch.from_numpy(chunk).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(position_offset, position_offset + n, device=device)
        with torch.autocast(
            device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
        ):
            hidden = model.hidden_states(inputs, positions)
        nll = torch.empty(inputs.shape, dtype=torch.float32, device=device)
        step = max(1, logits_chunk_tokens // len(batch))
        for t0 in range(0, n, step):
            logits = model.lm_head(hidden[:, t0 : t0 + step].float())
            nll[:, t0 : t0 + step] = F.cross_entropy(
                logits.flatten(0, 1), targets[:, t0 : t0 + step].flatten(), reduction="none"
            ).view(len(batch), -1)
        nll = nll.cpu()
        for row, w in enumerate(batch):
            scored = nll[row, w.score_from :].double()
            where = torch.arange(w.score_from, n) // bucket_size
            bucket_nll.index_add_(0, where, scored)
            bucket_count.index_add_(0, where, torch.ones_like(where))
            result.nll += float(scored.sum())
            result.tokens += n - w.score_from
            # target j of this window is token start + 1 + j of the split
            lo, hi = w.start + 1 + w.score_from, w.start + 1 + n
            result.words += int(words[lo:hi].sum())
            result.bytes += int(nbytes[lo:hi].sum())
        bar.update(len(batch))
    bar.close()
    result.seconds = time.perf_counter() - started
    result.bucket_nll = bucket_nll.tolist()
    result.bucket_count = bucket_count.tolist()
    return result
