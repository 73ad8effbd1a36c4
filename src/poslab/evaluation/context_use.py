"""How much of its context a model uses: the long–short difference behind LongPPL (Fang et al.,
ICLR 2025, "What is Wrong with Perplexity for Long-context Language Modeling?").

Per token, gain = NLL with only a short context − NLL with the full window (nats; positive: the
far context helped). A flat perplexity curve can come from reading far or from ignoring the far
context (LM-Infinite's Λ-mask and ALiBi's bias are flat by construction); the gain tells them
apart. With `eval.short_context=c`, every non-overlapping row longer than c reports:

* `context_gain`: the mean gain over its tokens;
* `key_token_share`: the share of tokens whose gain exceeds `eval.gain_threshold` (LongPPL's
  α = 2 nats: the key tokens), and `key_token_ppl`, the perplexity of those tokens with the full
  window (LongPPL, on this model's own key tokens);
* `gain_by_distance`: the mean gain by the token's position in its window (how much context it
  had), in buckets of eval.bucket_size.

The short NLL comes from a sliding pass with window c and stride c/2, so each token is scored
with between c/2 and c − 1 tokens of context (the first c − 1 of the split: fewer); tokens at
window positions below c have no more context in the long window than in the short one, and
their gain is the difference of two contexts of about the same size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from poslab.data.tokens import TokenizedSplit
from poslab.evaluation.perplexity import score

# LongPPL's α: a token is key when the long context lowers its NLL by more than this
DEFAULT_THRESHOLD = 2.0


def short_context_nll(model: Any, split: TokenizedSplit, short: int, **options: Any) -> np.ndarray:
    """Every target's NLL with at most `short` − 1 tokens of context (a sliding pass)."""
    stride = max(1, short // 2)
    result = score(model, split, short, "sliding", stride, token_nll=True, **options)
    return result.token_nll


def context_use(
    long_nll: np.ndarray, short_nll: np.ndarray, length: int, threshold: float, bucket: int
) -> dict[str, Any]:
    """The context-use fields of a non-overlapping row at `length` from the per-target NLLs of
    its long pass and of the short pass (target t sits at position t mod length)."""
    scored = np.isfinite(long_nll) & np.isfinite(short_nll)
    index = np.flatnonzero(scored)
    gain = short_nll[index].astype(np.float64) - long_nll[index].astype(np.float64)
    key = gain > threshold
    position = index % length
    by_distance = []
    for first in range(0, length, bucket):
        inside = (position >= first) & (position < first + bucket)
        if inside.any():
            by_distance.append([first, float(gain[inside].mean()), int(inside.sum())])
    key_nll = long_nll[index][key].astype(np.float64)
    return {
        "context_gain": float(gain.mean()) if len(gain) else float("nan"),
        "key_token_share": float(key.mean()) if len(gain) else float("nan"),
        "key_tokens": int(key.sum()),
        "key_token_ppl": math.exp(min(float(key_nll.mean()), 700.0)) if len(key_nll) else None,
        "gain_threshold": threshold,
        "gain_by_distance": by_distance,
    }
