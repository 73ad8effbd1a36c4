"""Extrapolation evaluation: metric definitions, long-length path, offsets, files, comparison."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, run_in_process
from omegaconf import OmegaConf

import poslab.attention
import poslab.evaluation.run
from poslab.attention import SDPA
from poslab.data.tokens import TokenizedSplit
from poslab.errors import ConfigError
from poslab.evaluation.compare import compare, shape_checks
from poslab.evaluation.perplexity import make_windows, score
from poslab.evaluation.run import evaluate_checkpoint, scored_token_cap
from poslab.model import GPT, GPTConfig
from poslab.positions.alibi import ALiBi
from poslab.positions.nope import NoPositions
from poslab.positions.rope import Rotary
from poslab.positions.sinusoidal import SinusoidalPositions
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


@pytest.mark.parametrize("scheme", [NoPositions, Rotary, ALiBi, T5Bias])
def test_relative_schemes_are_offset_invariant(scheme):
    model, data = tiny_model(scheme), toy_split()
    base = score(model, data, 32, progress=False)
    shifted = score(model, data, 32, position_offset=1000, progress=False)
    assert shifted.nll == pytest.approx(base.nll, rel=1e-5)


def test_absolute_schemes_are_not_offset_invariant():
    model, data = tiny_model(SinusoidalPositions, scale=1.0), toy_split()
    base = score(model, data, 32, progress=False)
    shifted = score(model, data, 32, position_offset=1000, progress=False)
    assert abs(shifted.nll - base.nll) / base.nll > 1e-3


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


def eval_cfg(**overrides):
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.max_tokens, cfg.log_wandb = 1500, False
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def test_evaluate_checkpoint_writes_every_output(trained_runs, tmp_path):
    run, _ = trained_runs["alibi"]
    cfg = eval_cfg(factors=[1, 2, 16], modes=["nonoverlapping", "sliding"])
    rows = evaluate_checkpoint(run / "checkpoints" / "best.ckpt", cfg, out_dir=tmp_path)
    out = tmp_path / "extrapolation"
    for name in ("extrapolation.json", "extrapolation.csv", "extrapolation.md",
                 "extrapolation_ppl.png", "extrapolation_loss_by_position.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    assert (out / "extrapolation_ppl.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "extrapolation.json").read_text())
    assert [(r["mode"], r["length"]) for r in saved] == [
        ("nonoverlapping", 16), ("nonoverlapping", 32), ("nonoverlapping", 256),
        ("sliding", 16), ("sliding", 32), ("sliding", 256),
    ]  # fmt: skip
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in rows)
    assert saved[0]["word_ppl"] == pytest.approx(saved[0]["ppl"], rel=1e-6)  # word tokenizer
    assert "| nonoverlapping |" in (out / "extrapolation.md").read_text()
    header = (out / "extrapolation.csv").read_text().splitlines()[0]
    assert header.startswith("scheme,train_length,mode,split,length")


def test_after_train_evaluation_files_exist(trained_runs):
    for run, _ in trained_runs.values():
        rows = json.loads((run / "extrapolation" / "extrapolation.json").read_text())
        assert {r["length"] for r in rows} == {16, 32, 64}


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5", "nope"])
def test_checkpoint_offset_invariance(trained_runs, tmp_path, scheme):
    ckpt = trained_runs[scheme][0] / "checkpoints" / "best.ckpt"
    cfg = dict(factors=[1, 4], modes=["nonoverlapping"])
    base = evaluate_checkpoint(ckpt, eval_cfg(**cfg), out_dir=tmp_path / "a")
    shifted = evaluate_checkpoint(
        ckpt, eval_cfg(position_offset=777, **cfg), out_dir=tmp_path / "b"
    )
    for a, b in zip(base, shifted, strict=True):
        assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-4)


def test_learned_beyond_its_table(trained_runs, tmp_path):
    ckpt = trained_runs["learned"][0] / "checkpoints" / "best.ckpt"
    with pytest.raises(ConfigError, match="beyond the table"):
        evaluate_checkpoint(ckpt, eval_cfg(unsupported="error"), out_dir=tmp_path)
    rows = evaluate_checkpoint(ckpt, eval_cfg(unsupported="skip"), out_dir=tmp_path)
    ok = [r["status"] == "ok" for r in rows if r["mode"] == "nonoverlapping"]
    assert ok == [True, False, False, False, False]  # 16 fits the 16-row table, 32…256 do not
    clamped = evaluate_checkpoint(
        ckpt, eval_cfg(unsupported="error", pos_overrides={"beyond_table": "clamp"}),
        out_dir=tmp_path,
    )  # fmt: skip
    assert all(r["status"] == "ok" for r in clamped)


def test_one_stride_serves_every_length(trained_runs, tmp_path):
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    rows = evaluate_checkpoint(
        ckpt, eval_cfg(modes=["sliding"], stride=48, factors=[1, 4]), out_dir=tmp_path
    )
    assert [r["stride"] for r in rows] == [16, 48]  # capped at the 16-token window


def test_compare_merges_runs_into_one_table(trained_runs, tmp_path):
    rows = compare([run for run, _ in trained_runs.values()], tmp_path)
    table = (tmp_path / "comparison.md").read_text()
    for scheme in trained_runs:
        assert f"| {scheme} |" in table
    assert {r["scheme"] for r in rows} == set(trained_runs)
    assert (tmp_path / "comparison_ppl.png").stat().st_size > 0
    assert (tmp_path / "comparison_loss_by_position.png").stat().st_size > 0


def test_shape_checks_follow_the_paper():
    def rows(ratios):
        out = []
        for scheme, r in ratios.items():
            for factor, ppl in ((1.0, 100.0), (8.0, 100.0 * r)):
                out.append({"scheme": scheme, "mode": "nonoverlapping", "factor": factor,
                            "ppl": ppl, "status": "ok"})  # fmt: skip
        return out

    good = shape_checks(rows({"sinusoidal": 5.0, "rope": 1.5, "alibi": 0.97, "t5": 1.1}))
    assert len(good) == 4 and all(line.startswith("- [x]") for line in good)
    bad = shape_checks(rows({"sinusoidal": 2.0, "rope": 1.01, "alibi": 1.2, "t5": 1.5}))
    assert all(line.startswith("- [ ]") for line in bad)


def test_eval_py_cli_prints_the_table(trained_runs, tmp_path, monkeypatch, capfd):
    run, _ = trained_runs["rope"]
    result = run_in_process(
        "eval", [f"run={run}", "eval.max_tokens=800", "eval.factors=[1,16]",
                 "eval.modes=[nonoverlapping,sliding]", f"out_dir={tmp_path}", "wandb=false"],
        tmp_path, monkeypatch, capfd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| nonoverlapping |" in result.stdout and "| sliding |" in result.stdout
    assert (tmp_path / "extrapolation" / "extrapolation.json").is_file()
    # with out_dir= nothing else is created: no outputs/eval/DATE/TIME, no .hydra/
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.log", "extrapolation"]
    (tmp_path / "foreign.ckpt").write_bytes(b"not a checkpoint")
    cases = (("missing.ckpt", "does not exist"), ("foreign.ckpt", "is corrupt or incomplete"))
    for name, message in cases:
        bad = run_in_process("eval", [f"ckpt={tmp_path / name}"], tmp_path, monkeypatch, capfd)
        assert bad.returncode == 2 and message in bad.stderr
        assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_bf16_and_fp32_perplexities_agree_on_a_trained_checkpoint(trained_runs, tmp_path, scheme):
    """eval.precision=bf16-mixed (auto's choice on bf16-native hardware) changes perplexity by
    less than 0.5% at the training length and at 4× it."""
    ckpt = trained_runs[scheme][0] / "checkpoints" / "best.ckpt"
    cfg = dict(factors=[1, 4], max_tokens=600)
    fp32 = evaluate_checkpoint(ckpt, eval_cfg(precision="32-true", **cfg), out_dir=tmp_path / "a")
    bf16 = evaluate_checkpoint(
        ckpt, eval_cfg(precision="bf16-mixed", **cfg), out_dir=tmp_path / "b"
    )
    for a, b in zip(fp32, bf16, strict=True):
        assert a["tokens"] == b["tokens"] > 0
        assert abs(b["ppl"] - a["ppl"]) / a["ppl"] < 0.005, (a["length"], a["ppl"], b["ppl"])


def test_max_tokens_auto_caps_only_a_short_runs_evaluation_and_says_so(
    trained_runs, tmp_path, monkeypatch, capsys
):
    ckpt = trained_runs["nope"][0] / "checkpoints" / "best.ckpt"
    monkeypatch.setattr(poslab.evaluation.run, "AUTO_MIN_TOKENS", 500)
    cfg = eval_cfg(max_tokens="auto", factors=[1])
    whole = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "a")  # eval.py: no training budget
    assert "eval.max_tokens=auto" not in capsys.readouterr().out
    capped = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "b", trained_tokens=100)
    assert "eval.max_tokens=auto: scoring the first" in capsys.readouterr().out
    assert capped[0]["tokens"] <= 500 < whole[0]["tokens"]


@pytest.mark.parametrize("setting", [0, 1, -5, "many", 2.5, True])
def test_max_tokens_rejects_what_is_not_a_token_count(setting):
    with pytest.raises(ConfigError, match="eval.max_tokens"):
        scored_token_cap(setting, None)


def test_max_tokens_values():
    assert scored_token_cap(None, 10) is None
    assert scored_token_cap(1000, None) == 1000
    assert scored_token_cap("auto", None) is None
    assert scored_token_cap("auto", 10**7) == 10**7
    assert scored_token_cap("auto", 10) == poslab.evaluation.run.AUTO_MIN_TOKENS
