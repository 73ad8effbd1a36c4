"""evaluation/perplexity.py: the metrics against their definitions (non-overlapping and
sliding windows, words, bytes, position buckets) and the long-length path (a bias built per block
of queries, memory linear in the length). The evaluation's position offset, for every scheme:
tests/positions/test_properties.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from poslab.data.tokens import TokenizedSplit
from poslab.evaluation.perplexity import make_windows, score
from poslab.model.attention import SDPA
from poslab.model.gpt import GPT, GPTConfig
from poslab.positions.alibi import ALiBi
from poslab.positions.nope import NoPositions
from poslab.positions.rope import Rotary
from poslab.positions.t5 import T5Bias

VOCAB = 37


def tiny_model(scheme_cls, block: int = 1024, full_bias_mib: int = 256, **kw) -> GPT:
    torch.manual_seed(0)
    kernel = SDPA(block_size=block, full_bias_mib=full_bias_mib)
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32)
    model = GPT(config, scheme_cls(32, 4, **kw), kernel)
    with torch.no_grad():  # larger weights, so positions visibly matter
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def toy_split(n: int = 203, seed: int = 1) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, n).astype(np.int32)
    words = rng.integers(0, 3, n).astype(np.int32)
    nbytes = rng.integers(0, 9, n).astype(np.int32)
    return TokenizedSplit(ids, words, nbytes)


def direct_nonoverlapping(model: GPT, ids: np.ndarray, length: int) -> tuple[float, int]:
    """The definition: consecutive windows of `length` inputs, each scored from scratch."""
    x = torch.from_numpy(ids.astype(np.int64))
    total, count = 0.0, 0
    for start in range(0, len(x) - 1, length):
        inputs = x[start : start + length]
        targets = x[start + 1 : start + length + 1]
        inputs = inputs[: len(targets)]
        logits = model(inputs[None])[0]
        total += F.cross_entropy(logits.double(), targets, reduction="sum").item()
        count += len(targets)
    return total, count


@pytest.mark.parametrize("length", [8, 16, 50, 500])
def test_nonoverlapping_equals_direct_computation(length):
    model, data = tiny_model(Rotary), toy_split()
    result = score(model, data, length, "nonoverlapping", batch_size=3, progress=False)
    nll, count = direct_nonoverlapping(model, data.ids, length)
    assert result.tokens == count == len(data.ids) - 1
    assert result.nll == pytest.approx(nll, rel=1e-5)
    assert result.ppl == pytest.approx(math.exp(nll / count), rel=1e-5)


def test_sliding_windows_score_every_token_once_with_enough_context():
    for n, length, stride in [(203, 16, 4), (203, 16, 16), (10, 16, 4), (100, 7, 3)]:
        windows = make_windows(n, length, "sliding", stride)
        scored = []
        for w in windows:
            assert w.length <= length
            for j in range(w.score_from, w.length):
                target = w.start + 1 + j
                scored.append(target)
                # context of the token: inputs w.start .. target-1
                assert target - w.start >= min(target, length - stride + 1)
        assert scored == list(range(1, n))


@pytest.mark.parametrize("stride", [4, 8])
def test_sliding_equals_direct_computation(stride):
    length = 16
    model, data = tiny_model(ALiBi), toy_split()
    result = score(model, data, length, "sliding", stride=stride, batch_size=5, progress=False)
    x = torch.from_numpy(data.ids.astype(np.int64))
    nll, count = 0.0, 0
    for w in make_windows(len(x), length, "sliding", stride):
        logits = model(x[w.start : w.start + w.length][None])[0]
        targets = x[w.start + 1 : w.start + w.length + 1]
        per_token = F.cross_entropy(logits.double(), targets, reduction="none")
        nll += per_token[w.score_from :].sum().item()
        count += w.length - w.score_from
    assert result.tokens == count == len(x) - 1
    assert result.nll == pytest.approx(nll, rel=1e-5)
    # with stride == length (and no partial tail window, where sliding keeps a full window of
    # context), sliding is exactly the nonoverlapping evaluation
    whole = toy_split(12 * length + 1)
    same = score(model, whole, length, "sliding", stride=length, progress=False)
    plain = score(model, whole, length, "nonoverlapping", progress=False)
    assert same.nll == pytest.approx(plain.nll, rel=1e-9)


def test_word_and_byte_metrics_and_position_buckets():
    model, data = tiny_model(NoPositions), toy_split()
    result = score(model, data, 16, "nonoverlapping", bucket_size=4, progress=False)
    words, nbytes = int(data.words[1:].sum()), int(data.bytes[1:].sum())
    assert (result.words, result.bytes) == (words, nbytes)
    assert result.word_ppl == pytest.approx(math.exp(result.nll / words))
    assert result.bits_per_byte == pytest.approx(result.nll / nbytes / math.log(2))
    buckets = result.loss_by_position()
    assert [b for b, _, _ in buckets] == [0, 4, 8, 12]
    assert sum(result.bucket_count) == result.tokens
    assert sum(result.bucket_nll) == pytest.approx(result.nll)


@pytest.mark.parametrize("scheme", [ALiBi, T5Bias])
def test_blockwise_long_path_equals_plain_path(scheme):
    data = toy_split(400)
    plain = score(tiny_model(scheme, block=1024), data, 128, progress=False)
    blocked = score(tiny_model(scheme, block=16), data, 128, progress=False)
    assert blocked.nll == pytest.approx(plain.nll, rel=1e-5)


def test_long_length_memory_stays_linear(monkeypatch):
    """A bias-scheme window whose whole bias exceeds attention.full_bias_mib (lowered here so
    that 4096 tokens suffice): the bias of one query block is block×T, never T×T."""
    model, data = tiny_model(ALiBi, block=256, full_bias_mib=16), toy_split(4100)
    calls = []
    original = model.pos.attention_bias

    def spy(q_pos, k_pos, layer=0):
        out = original(q_pos, k_pos, layer)
        calls.append(out.shape)
        return out

    model.pos.attention_bias = spy
    score(model, data, 4096, progress=False)
    assert calls and max(s[1] for s in calls) <= 256 and max(s[2] for s in calls) == 4096


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_scoring_records_no_graph(mode):
    """Evaluation builds no autograd graph: with one, a 16·L window keeps every activation of
    every layer (a DAPE or CoPE model at 4,096 tokens then needs > 14 GB instead of ~4). A
    forward hook on the real model sees whether inference mode is on."""
    model = tiny_model(Rotary).train()  # parameters that require gradients, as after training
    seen: list[tuple[bool, bool]] = []
    model.blocks[0].register_forward_hook(
        lambda module, args, out: seen.append(
            (torch.is_inference_mode_enabled(), out.requires_grad)
        )
    )
    score(model, toy_split(), 16, mode, 8 if mode == "sliding" else None, progress=False)
    assert seen and all(inference and not grad for inference, grad in seen), seen
