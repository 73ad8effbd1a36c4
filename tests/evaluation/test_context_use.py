"""evaluation/context_use.py: the long–short difference (LongPPL's gain per token). A model that
cannot see past the short context gains nothing from the long window; one that can, gains; the
summary fields are what the per-token gains say."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import eval_cfg, score_checkpoint
from models import VOCAB, tiny_gpt

from poslab.data.tokens import TokenizedSplit
from poslab.evaluation.context_use import context_use, short_context_nll
from poslab.evaluation.perplexity import score


def split_of(n: int, seed: int = 3) -> TokenizedSplit:
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).numpy()
    ones = np.ones(n, dtype=np.int32)
    return TokenizedSplit(ids.astype(np.int32), ones, ones)


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_token_nll_holds_every_scored_target_once(mode):
    model, data = tiny_gpt("rope"), split_of(300)
    result = score(model, data, 32, mode, 12, token_nll=True, progress=False)
    scored = np.isfinite(result.token_nll)
    assert scored.sum() == result.tokens == len(data.ids) - 1
    assert result.token_nll[scored].astype(np.float64).sum() == pytest.approx(result.nll, rel=1e-5)


def gains(model, data, length: int, short: int) -> np.ndarray:
    long = score(model, data, length, "nonoverlapping", token_nll=True, progress=False)
    fields = context_use(
        long.token_nll,
        short_context_nll(model, data, short, progress=False),
        length,
        threshold=0.5,
        bucket=8,
    )
    return fields


def test_a_model_that_sees_only_its_neighbours_gains_nothing_from_a_long_window():
    """2 layers of 3-token sliding-window attention see 5 tokens back; the short pass (c = 16,
    stride 8) gives every token at least 8: from window position 8 on (bucket 8) the long window
    adds nothing. (Below it the long window holds less context than the short pass.)"""
    data = split_of(600)
    local = tiny_gpt("nope", kernel_options={"window": 3})
    fields = gains(local, data, 64, 16)
    far = [g for first, g, _ in fields["gain_by_distance"] if first >= 8]
    assert len(far) == 7 and all(abs(g) < 1e-5 for g in far), far
    assert math.isfinite(fields["context_gain"])
    # the same weights attending everywhere: the far context changes the losses
    full = tiny_gpt("nope")
    assert max(abs(g) for _, g, _ in gains(full, data, 64, 16)["gain_by_distance"]) > 1e-3


def test_the_summary_is_what_the_gains_say():
    long = np.array([1.0, 1.0, 0.5, 0.2, np.nan, 3.0], dtype=np.float32)
    short = np.array([1.0, 4.0, 0.5, 3.0, 2.0, np.nan], dtype=np.float32)
    fields = context_use(long, short, length=2, threshold=2.0, bucket=1)
    # scored in both: targets 0-3, gains 0, 3, 0, 2.8; key (> 2): targets 1 and 3
    assert fields["context_gain"] == pytest.approx((0 + 3 + 0 + 2.8) / 4)
    assert fields["key_token_share"] == 0.5 and fields["key_tokens"] == 2
    assert fields["key_token_ppl"] == pytest.approx(math.exp((1.0 + 0.2) / 2))
    # position in the window (t mod 2): 0 -> targets 0, 2; 1 -> targets 1, 3
    assert fields["gain_by_distance"] == [[0, 0.0, 2], [1, pytest.approx(2.9), 2]]


def test_eval_reports_context_use_on_rows_longer_than_the_short_context(trained_runs):
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    rows = score_checkpoint(
        ckpt, eval_cfg(factors=[1, 2, 4], modes=["nonoverlapping", "sliding"], short_context=16)
    )
    measured = [(r["mode"], r["length"]) for r in rows if "context_gain" in r]
    assert measured == [("nonoverlapping", 32), ("nonoverlapping", 64)]  # L = 16: not > c
    for row in rows:
        assert "token_nll" not in row  # taken, never written out
        if "context_gain" in row:
            assert math.isfinite(row["context_gain"]) and 0 <= row["key_token_share"] <= 1
            assert row["short_context"] == 16 and row["gain_by_distance"]
