"""attention=linear: the chunked prefix sums equal the O(T²) formula, RoPE's numerator depends
on m − n only, the cosine similarity, clear errors for schemes that need the score matrix, and a
real training run (causality and offset invariance end to end, for every scheme linear
attention serves: tests/positions/test_properties.py)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose_train
from torch import nn

from poslab.errors import ConfigError
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import FEATURE_MAPS, Linear, causal_linear_attention
from poslab.positions import build_scheme, scheme_configs
from poslab.positions.nope import NoPositions
from poslab.positions.rope import Rotary

D_MODEL, N_HEAD, VOCAB = 32, 4, 40


def direct(q_num, k_num, q_den, k_den, v, eps=1e-6):
    """The formula with the whole T×T matrices (the reference)."""
    future = torch.ones(q_num.shape[-2], k_num.shape[-2]).triu(1).bool()
    num = (q_num @ k_num.transpose(-1, -2)).masked_fill(future, 0)
    den = (q_den @ k_den.transpose(-1, -2)).masked_fill(future, 0).sum(-1, keepdim=True)
    return (num @ v) / den.clamp_min(eps)


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_prefix_sums_equal_the_direct_formula(chunk):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    qd, kd = FEATURE_MAPS["elu1"](q), FEATURE_MAPS["elu1"](k)
    qn, kn = qd * torch.randn_like(qd), kd  # a numerator other than the denominator
    got = causal_linear_attention(qn, kn, qd, kd, v, chunk_size=chunk)
    torch.testing.assert_close(got, direct(qn, kn, qd, kd, v), rtol=1e-9, atol=1e-9)


def build(pos, similarity="feature", seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    model = GPT(config, pos, Linear(similarity=similarity, chunk_size=8))
    with torch.no_grad():  # far from uniform attention, so positions visibly matter
        for p in model.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.3)
    return model.eval()


SIMILARITIES = ["feature", "cosine"]


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_linear_attention_equals_the_direct_formula_with_rope(similarity):
    model = build(Rotary(D_MODEL, N_HEAD), similarity)
    kernel, pos = model.attention, model.pos
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, N_HEAD, 21, D_MODEL // N_HEAD, generator=gen) for _ in range(3))
    prepared = pos.prepare(torch.arange(21))
    features = kernel.features(q, k, pos, prepared, 0)
    got = kernel(q, k, v, pos, prepared, None, 0, 0.0)
    torch.testing.assert_close(got, direct(*features, v), rtol=1e-5, atol=1e-5)
    if similarity == "cosine":  # 1 + cos of rotated unit vectors: in [0, 2]
        s = features[0] @ features[1].transpose(-1, -2)
        assert s.min() >= -1e-6 and s.max() <= 2 + 1e-6


def test_rope_numerator_depends_on_positions_through_their_difference_only():
    pos, kernel = Rotary(D_MODEL, N_HEAD), Linear()
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(1, N_HEAD, 12, D_MODEL // N_HEAD, generator=gen) for _ in range(2))
    scores = []
    for offset in (0, 1000):
        q_num, k_num, _, _ = kernel.features(q, k, pos, pos.prepare(torch.arange(12) + offset), 0)
        scores.append(q_num @ k_num.transpose(-1, -2))
    torch.testing.assert_close(scores[0], scores[1], atol=1e-4, rtol=1e-4)
    # and positions do matter: the features themselves move with the offset
    plain = kernel.features(q, k, NoPositions(D_MODEL, N_HEAD), None, 0)[0]
    assert (plain @ plain.transpose(-1, -2) - scores[0]).abs().max() > 1e-2


# the schemes that need a bias or the scores from the kernel (alibi, t5, ...)
NEEDS_SCORES = [
    name
    for name, cfg in scheme_configs().items()
    if build_scheme(name, D_MODEL, N_HEAD, seq_len=64).needs != "nothing"
]


@pytest.mark.parametrize("scheme", NEEDS_SCORES)
def test_schemes_that_need_the_score_matrix_are_a_one_line_error(scheme, tmp_path):
    from poslab.run.validate import check_run_config

    cfg = compose_train([f"pos={scheme}", "attention=linear", "model=tiny"], tmp_path)
    with pytest.raises(
        ConfigError, match="attention=linear cannot serve .* never forms the score matrix"
    ):
        check_run_config(cfg)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"feature_map": "tanh"}, "attention.feature_map=tanh"),
        ({"similarity": "dot"}, "attention.similarity=dot"),
        ({"chunk_size": 0}, "attention.chunk_size=0"),
        ({"eps": 0}, "attention.eps=0"),
    ],
)
def test_bad_linear_options(options, message):
    with pytest.raises(ConfigError, match=message):
        Linear(**options)


@pytest.mark.parametrize("scheme", ["rope", "learned"])
def test_training_with_linear_attention(corpus, tmp_path, scheme):
    from poslab.run.training import run_training

    cfg = compose_train(
        [
            f"pos={scheme}",
            "attention=linear",
            f"data.path={corpus}",
            "model=tiny",
            "data.seq_len=16",
            "data.batch_size=16",
            "trainer.max_steps=30",
            "trainer.val_check_interval=15",
            "trainer.enable_progress_bar=false",
            "optim.lr=3e-3",
            "logger=csv",
            "eval.factors=[1,4]",
            "eval.max_tokens=1500",
        ],
        tmp_path,
    )
    metrics = run_training(cfg)
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    rows = json.loads((tmp_path / "extrapolation" / "extrapolation.json").read_text())
    assert {r["scheme"] for r in rows} == {f"{scheme}, linear attention"}  # not softmax's row
    assert (
        [r["length"] for r in rows] == [16, 64]
        and all(r["status"] == "ok" for r in rows)
        or scheme == "learned"
    )


@pytest.mark.parametrize(
    "scaling",
    [
        {"kind": "none", "logn": True, "train_length": 64},
        {"kind": "yarn", "factor": 4.0, "train_length": 64},
    ],
)
def test_an_eval_time_temperature_is_refused_by_linear_attention(scaling):
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    with pytest.raises(ConfigError, match="attention=linear cannot take the temperature"):
        GPT(config, Rotary(D_MODEL, N_HEAD, scaling=scaling), Linear())
    GPT(
        config,
        Rotary(D_MODEL, N_HEAD, scaling={"kind": "ntk", "factor": 4.0, "train_length": 64}),
        Linear(),
    )  # a change of the base alone is fine
