"""The analysis plots (poslab/analysis/, scripts/analysis.py): RoPE's decay bound and
wavelengths against their definitions, sinusoidal similarity against the scheme's own vectors,
and the attention statistics of tiny models (built, not trained), also read back from a real
checkpoint file on a real token cache."""

from __future__ import annotations

import cmath
import csv
import math

import numpy as np
import pytest
import torch

from poslab.analysis import (
    AttentionRecorder,
    attention_statistics,
    decay_bound,
    decay_distances,
    main,
    rope_thetas,
    sinusoidal_similarity,
    uniform_reference,
    wavelengths,
    yarn_ramp,
)
from poslab.data.cache import TokenCache
from poslab.model.build import build_model
from poslab.positions import scheme_configs
from poslab.positions.rope import rope_theta
from poslab.positions.sinusoidal import SinusoidalPositions

TRAIN_LENGTH = 16


# ---------------------------------------------------------------------------------------------
# RoPE: decay bound and wavelengths


@pytest.mark.parametrize("head_dim", [2, 64, 128])
@pytest.mark.parametrize("base", [100.0, 10000.0, 500000.0])
def test_decay_bound_at_zero_is_its_closed_form(head_dim, base):
    # every S_j = j at r = 0: (1/(d/2))·Σ_{j=1..d/2} j = (d/2 + 1)/2
    assert decay_bound(np.array([0]), head_dim, base)[0] == pytest.approx((head_dim / 2 + 1) / 2)


def test_decay_bound_is_its_definition_and_falls_overall():
    r, d, base = 37, 16, 10000.0
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    partial = [sum(cmath.exp(1j * r * theta[i]) for i in range(j)) for j in range(1, d // 2 + 1)]
    assert decay_bound(np.array([r]), d, base)[0] == pytest.approx(sum(map(abs, partial)) / (d / 2))
    np.testing.assert_allclose(rope_thetas(64, 10000.0), rope_theta(64, 10000.0), rtol=1e-6)

    distances = decay_distances(16384)
    assert distances[0] == 0 and distances[-1] == 16384 and (np.diff(distances) > 0).all()
    assert {1, 255, 256, 1024, 16384} <= set(distances.tolist())
    for d in (64, 128):
        for base in (100.0, 10000.0, 500000.0):
            bound = decay_bound(distances, d, base)
            near = bound[(distances >= 1) & (distances <= 16)].mean()
            far = bound[distances >= 4096].mean()
            assert far < near < bound[0], (d, base)


def test_wavelengths_and_the_seed_faq_numbers():
    """The FAQ: d = 512, i = 0 → 6.28, i = 128 → 316, i = 256 → 15811. What holds of it."""
    faq = {0: 6.28, 128: 316.0, 256: 15811.0}
    lam = wavelengths(512, 10000.0)
    assert len(lam) == 256  # i = 0..d/2 − 1: this convention has no i = 256
    assert lam[0] == pytest.approx(faq[0], rel=1e-3)  # 2π: holds in every convention
    assert lam[128] == pytest.approx(200 * math.pi)  # 628, not the FAQ's 316
    assert lam[255] == pytest.approx(2 * math.pi * 10000 ** (510 / 512))
    # the FAQ's numbers are geometric (×≈50 per 128 indices) and fit base ≈ 2500 within 1%
    assert faq[128] / faq[0] == pytest.approx(faq[256] / faq[128], rel=0.01)
    lam2500 = wavelengths(512, 2500.0)
    assert lam2500[0] == pytest.approx(faq[0], rel=0.01)
    assert lam2500[128] == pytest.approx(faq[128], rel=0.01)
    assert 2 * math.pi * 2500 ** (2 * 256 / 512) == pytest.approx(faq[256], rel=0.01)
    # and no other natural base-10000 convention gives 316 at i = 128
    for other in (2 * math.pi * 10000 ** (128 / 512), 2 * math.pi * 10000 ** (2 * 128 / 510)):
        assert abs(other / faq[128] - 1) > 0.1

    # YaRN's ramp on r_i = L/λ_i: 0 below α = 1 (no full turn in L), 1 above β = 32
    ratio = 512 / wavelengths(128, 10000.0)
    gamma = yarn_ramp(ratio)
    assert (gamma[ratio <= 1] == 0).all() and (gamma[ratio >= 32] == 1).all()
    inside = (ratio > 1) & (ratio < 32)
    np.testing.assert_allclose(gamma[inside], (ratio[inside] - 1) / 31)
    assert (np.diff(gamma) <= 0).all()  # λ grows with i


# ---------------------------------------------------------------------------------------------
# sinusoidal positions


def test_sinusoidal_similarity_is_the_schemes_own_and_peaks_at_zero():
    d, n = 64, 512
    sim = sinusoidal_similarity(n, d)
    assert sim[0] == pytest.approx(1.0) and (sim[1:] < sim[0]).all()
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    np.testing.assert_allclose(sim, np.cos(np.arange(n + 1)[:, None] * omega).mean(1), atol=1e-5)
    # from the scheme's embeddings, at another offset: p_m·p_n depends on m − n only
    scheme = SinusoidalPositions(d, 4)
    with torch.no_grad():
        p = scheme.embed(torch.zeros(1, 100 + n + 1, d), torch.arange(100 + n + 1))[0]
    p = p.double().numpy() / scheme.scale
    np.testing.assert_allclose(p[100:] @ p[100] / (d / 2), sim, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# attention


def tiny_config(pos: str, data: dict | None = None) -> dict:
    return {
        "data": data or {"seq_len": TRAIN_LENGTH},
        "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 64, "dropout": 0.0},
        "pos": scheme_configs(TRAIN_LENGTH)[pos],
        "attention": {"_target_": "poslab.model.attention.Auto", "block_size": 1024},
        "pos_name": pos,
    }


def tiny_model(pos: str, vocab: int = 50, seed: int = 0):
    """A built model with large weights (so positions visibly shape attention)."""
    torch.manual_seed(seed)
    model = build_model(tiny_config(pos), vocab)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2 and not name.startswith("pos."):
                param.normal_(0, 0.3)
            elif name.startswith("pos.") and pos in ("t5", "cope"):
                param.normal_(0, 1.0)  # zero-initialised tables: give them something to say
    return model.eval()


@pytest.mark.parametrize("pos", ["rope", "alibi", "cope", "t5", "sinusoidal", "fire", "nope"])
def test_recorded_weights_are_causal_probabilities_and_change_nothing(pos):
    model = tiny_model(pos)
    ids = torch.randint(0, 50, (2, 4 * TRAIN_LENGTH), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
    recorder = AttentionRecorder(TRAIN_LENGTH, 2, 2, block_size=7)  # several query blocks
    recorder.check(model.pos, 0.0)
    model.attention, kernel = recorder, model.attention
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, atol=1e-4, rtol=0)
    model.attention = kernel
    stats = recorder.stats()
    assert stats.max_row_error < 1e-5 and stats.max_future_weight == 0.0
    assert ((stats.mass_beyond >= 0) & (stats.mass_beyond <= 1)).all()
    length = ids.shape[1]
    assert ((stats.mean_distance >= 0) & (stats.mean_distance <= (length - 1) / 2)).all()
    # one block or many, the same numbers; the model gets its own kernel back
    whole = attention_statistics(model, ids, TRAIN_LENGTH)
    np.testing.assert_allclose(whole.mean_distance, stats.mean_distance, rtol=1e-5)
    np.testing.assert_allclose(whole.mass_beyond, stats.mass_beyond, rtol=1e-5, atol=1e-7)
    assert model.attention is kernel
    if pos != "nope":
        assert np.ptp(stats.mean_distance) > 0.1  # heads differ: the positions are seen


def test_uniform_attention_gives_the_closed_form():
    assert uniform_reference(4, 2) == pytest.approx((0.75, (1 / 3 + 2 / 4) / 2))
    model = tiny_model("nope")
    with torch.no_grad():
        for block in model.blocks:  # q = k = 0: every score 0, every query uniform
            block.attn.qkv.weight[: 2 * 32] = 0
            block.attn.qkv.bias[: 2 * 32] = 0
    ids = torch.randint(0, 50, (3, 5 * TRAIN_LENGTH), generator=torch.Generator().manual_seed(2))
    stats = attention_statistics(model, ids, TRAIN_LENGTH)
    distance, mass = uniform_reference(5 * TRAIN_LENGTH, TRAIN_LENGTH)
    np.testing.assert_allclose(stats.mean_distance, distance, rtol=1e-6)
    np.testing.assert_allclose(stats.mass_beyond, mass, rtol=1e-6)


def write_checkpoint(path, pos: str, corpus, cache_dir) -> None:
    """A checkpoint as training writes it (the run config, the vocabulary size, `model.`
    weights), of a tiny built model whose vocabulary is the token cache's."""
    data = {
        "name": "toy",
        "path": str(corpus),
        "tokenizer": "word",
        "seq_len": TRAIN_LENGTH,
        "cache_dir": str(cache_dir),
    }
    vocab = TokenCache.from_config(data).meta()["vocab_size"]
    model = tiny_model(pos, vocab)
    config = tiny_config(pos, data)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {"hyper_parameters": {"config": config, "vocab_size": vocab}, "state_dict": state}
    torch.save(ckpt, path)


def test_attention_of_checkpoints_writes_rows_and_a_figure(corpus, tmp_path, capsys):
    cache = tmp_path / "cache"
    write_checkpoint(tmp_path / "rope.ckpt", "rope", corpus, cache)
    write_checkpoint(tmp_path / "run" / "checkpoints" / "best.ckpt", "rope", corpus, cache)
    write_checkpoint(tmp_path / "learned.ckpt", "learned", corpus, cache)
    out = tmp_path / "out"
    main(
        [
            "attention",
            str(tmp_path / "rope.ckpt"),
            str(tmp_path / "run"),
            str(tmp_path / "learned.ckpt"),
            "--out",
            str(out),
            "--windows",
            "2",
        ]
    )
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "beyond the table" in captured.err  # learned at 4×
    with (out / "attention.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2  # two rope checkpoints × 2 layers × 2 heads
    assert {r["scheme"] for r in rows} == {"rope [rope]", "rope [run]"}  # told apart
    for r in rows:
        assert 0 <= float(r["mass_beyond_L"]) <= 1
        assert 0 <= float(r["mean_distance"]) <= (4 * TRAIN_LENGTH - 1) / 2
        assert r["eval_length"] == str(4 * TRAIN_LENGTH) and r["windows"] == "2"
    # the same model in both files: the same numbers
    by = {(r["scheme"], r["layer"], r["head"]): float(r["mass_beyond_L"]) for r in rows}
    for (_, layer, head), value in by.items():
        assert by[("rope [run]", layer, head)] == pytest.approx(value)
    assert (out / "attention.png").stat().st_size > 0


def test_all_writes_three_figures_and_tables(tmp_path):
    out = tmp_path / "out"
    main(
        [
            "all",
            "--out",
            str(out),
            "--head-dims",
            "16",
            "--bases",
            "10000",
            "--max-distance",
            "1024",
            "--sin-distance",
            "256",
            "--d-models",
            "32",
        ]
    )
    columns = {
        "decay": ["distance", "base", "head_dim", "bound"],
        "wavelength": [
            "base",
            "head_dim",
            "i",
            "theta",
            "wavelength",
            "train_length",
            "ratio",
            "full_period",
            "yarn_gamma",
        ],
        "sinusoidal": ["distance", "d_model", "base", "similarity"],
    }
    for name, header in columns.items():
        assert (out / f"{name}.png").stat().st_size > 0
        with (out / f"{name}.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == header
    assert not (out / "attention.png").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["curvature"], "unknown analysis 'curvature'; choose one of decay"),
        (["attention"], "attention needs checkpoints"),
        (["theta"], "theta needs checkpoints"),
        (["attention", "no/such.ckpt"], "no such checkpoint or run folder: no/such.ckpt"),
        (["decay", "x.ckpt"], "decay takes no checkpoints"),
        (["decay", "--head-dims", "63"], "--head-dims must be even"),
        (["decay", "--max-distance", "ten"], "invalid int value: 'ten'"),
        (["attention", "{run}"], "run folder {run} has no checkpoints/best.ckpt or last.ckpt"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, message, tmp_path, capsys):
    run = tmp_path / "run"  # a run folder whose training saved no checkpoint
    (run / "checkpoints").mkdir(parents=True)
    argv, message = [a.format(run=run) for a in argv], message.format(run=run)
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_bf16_positions_keep_the_integers_bf16_holds_and_fp32_keeps_all():
    from poslab.analysis import position_collisions

    fp32 = position_collisions(8192, "fp32", d_model=64, n_head=4)
    assert fp32["exact_positions"] == fp32["distinct_angle_vectors"] == 1.0
    assert fp32["wrong_alibi_distances"] == 0.0
    bf16 = position_collisions(8192, "bf16", d_model=64, n_head=4)
    # 0..256 (257), 258..510 even (127), then 128 per octave up to 8192 (4 octaves)
    assert bf16["exact_positions"] == (257 + 127 + 4 * 128) / 8192  # the seed's ~10%
    assert bf16["distinct_angle_vectors"] < 0.12 and bf16["wrong_alibi_distances"] > 0.5


def test_theta_ratios_of_learnable_checkpoints(corpus, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "out"
    fixed = tmp_path / "fixed.ckpt"
    write_checkpoint(fixed, "rope", corpus, cache)
    ckpt = torch.load(fixed, weights_only=True)
    ckpt["hyper_parameters"]["config"]["pos"].update(learnable_theta=True, theta_param="log")
    init = rope_theta(32 // 2, 10000.0)  # tiny_config: d_model 32, 2 heads
    moved = init * torch.linspace(0.5, 2.0, init.numel())
    ckpt["state_dict"]["model.pos.log_theta"] = moved.log()
    torch.save(ckpt, tmp_path / "log.ckpt")
    main(["theta", str(tmp_path / "log.ckpt"), "--out", str(out)])
    with (out / "theta.csv").open() as f:
        rows = list(csv.DictReader(f))
    ratios = [float(r["ratio"]) for r in rows]
    assert ratios == pytest.approx(torch.linspace(0.5, 2.0, init.numel()).tolist(), rel=1e-5)
    assert rows[0]["variant"] == "rope θ log" and (out / "theta.png").stat().st_size > 0
    with pytest.raises(SystemExit):  # a fixed θ has nothing to show: one line, exit 2
        main(["theta", str(fixed), "--out", str(out)])
    assert "no learnable θ" in capsys.readouterr().err


def test_t5_bucket_shares_count_every_causal_pair():
    from poslab.analysis.t5_buckets import bucket_shares
    from poslab.positions.t5 import t5_bucket

    for length, max_distance in ((128, 128), (300, 32)):
        counts = np.zeros(32)
        for q in range(length):  # every causal (query, key) pair, one by one
            keys = torch.arange(q + 1)
            np.add.at(counts, t5_bucket(q - keys, 32, max_distance).numpy(), 1)
        np.testing.assert_allclose(bucket_shares(length, 32, max_distance), counts / counts.sum())
    # the last bucket (distances ≥ 113 with max_distance 128): rare at L = 128, most pairs at
    # 16 L; the ALiBi paper's L = 512 with the same 128 puts 61% of its training pairs there,
    # as max_distance = 32 does at L = 128
    assert bucket_shares(128, 32, 128)[-1] == pytest.approx(0.0145, abs=1e-4)
    assert bucket_shares(2048, 32, 128)[-1] == pytest.approx(0.8927, abs=1e-4)
    assert bucket_shares(512, 32, 128)[-1] == pytest.approx(0.6076, abs=1e-4)
    assert bucket_shares(128, 32, 32)[-1] == pytest.approx(0.5757, abs=1e-4)


def test_t5_analysis_reads_the_learned_table_of_a_checkpoint(corpus, tmp_path, capsys):
    cache, out = tmp_path / "cache", tmp_path / "out"
    write_checkpoint(tmp_path / "t5.ckpt", "t5", corpus, cache)
    ckpt = torch.load(tmp_path / "t5.ckpt", weights_only=True)
    table = ckpt["state_dict"]["model.pos.bias"]
    ckpt["state_dict"]["model.pos.bias"] = torch.arange(table.numel()).reshape(table.shape) * 0.1
    torch.save(ckpt, tmp_path / "t5.ckpt")
    main(["t5", str(tmp_path / "t5.ckpt"), "--factor", "16", "--out", str(out)])
    with (out / "t5_buckets.csv").open() as f:
        rows = list(csv.DictReader(f))
    heads = table.shape[-1]
    assert len(rows) == table.shape[1]  # one row per bucket
    for b, r in enumerate(rows[:3]):
        expected = [0.1 * (b * heads + h) for h in range(heads)]
        assert float(r["bias_mean"]) == pytest.approx(sum(expected) / heads, rel=1e-5)
        assert float(r["bias_head0"]) == pytest.approx(expected[0], rel=1e-5, abs=1e-6)
    assert sum(float(r["share_at_L"]) for r in rows) == pytest.approx(1.0)
    assert sum(float(r["share_at_16L"]) for r in rows) == pytest.approx(1.0)
    assert (out / "t5_buckets.png").stat().st_size > 0
    write_checkpoint(tmp_path / "rope.ckpt", "rope", corpus, cache)
    with pytest.raises(SystemExit):  # another scheme: one line, exit 2
        main(["t5", str(tmp_path / "rope.ckpt"), "--out", str(tmp_path / "o2")])
    assert "is not a t5 checkpoint" in capsys.readouterr().err
