"""Analysis plots (issue #9, part 5): what a positional scheme does to attention, in numbers.

* ``decay``: RoPE's long-range decay bound (RoFormer / the seed article). With
  θ_i = base^(−2i/d), i = 0..d/2−1, and the partial sums S_j = Σ_{i<j} e^{i·r·θ_i}, Abel
  summation bounds |q·k| at relative distance r by (max_i |h_{i+1} − h_i|)·Σ_{j=1..d/2} |S_j|;
  the part that depends on r, ``bound(r) = (1/(d/2))·Σ_j |S_j|``, is plotted (log distance axis,
  up to 16k) for several bases and head dims. bound(0) = (d/2 + 1)/2.
* ``wavelength``: λ_i = 2π/θ_i of every rotary frequency against a training length L, the
  quantity YaRN's ramp uses (r_i = L/λ_i, γ_i = clamp((r_i − α)/(β − α), 0, 1), α = 1, β = 32):
  dims with λ_i ≤ L complete a full period within L.
* ``sinusoidal``: the similarity p_m·p_n/(d/2) of the sinusoidal position vectors of Vaswani
  et al. against m − n ("oscillating decay"). Every vector has |p|² = d/2, so this is also their
  cosine similarity; it equals (1/(d/2))·Σ_i cos((m − n)·ω_i) and depends on m − n only.
* ``collisions``: the mixed-precision position bug (seed 001). For the positions 0..N−1 of the
  real schemes with ``position_dtype=bf16`` (and the fp32 default): the fraction of positions
  bf16 holds exactly, of distinct rotary angle vectors, and of keys whose ALiBi distance to the
  last query is wrong. bf16 keeps 8 significant bits: every integer up to 256, then 128 values
  per octave, so ~11% of 0..8191 stay exact.
* ``theta``: for checkpoints trained with a learnable θ (``pos.learnable_theta=true``), the
  ratio θ_i/θ_i(init) of every rotary frequency after training, against the frequency index
  (one line per run, labelled by ``pos.theta_param`` and seed): the RoFormer author's "θ barely
  moves", measured.
* ``attention``: per layer and head of trained checkpoints, on validation text at `factor`× the
  training length L: (a) the mean attention distance Σ_n w_mn·(m − n), averaged over all
  queries; (b) the attention mass on keys at distance m − n ≥ L, averaged over the queries
  m ≥ L (the only ones that have such keys). The weights are the reference ones
  (`Blockwise.weights`, every scheme hook applied), recorded by a kernel installed in the model.
  Uniform causal attention is drawn for reference: mean distance (T − 1)/4, mass beyond L
  mean_{m ≥ L} (m − L + 1)/(m + 1).

Each analysis writes NAME.png and NAME.csv to the output folder (default docs/results/analysis).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from torch import Tensor

from poslab.attention import Blockwise
from poslab.errors import ConfigError, exit_on_config_error
from poslab.evaluation.compare import OneLineParser, check_writable
from poslab.evaluation.report import line_styles

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

ANALYSES = ("decay", "wavelength", "sinusoidal", "collisions", "attention", "theta", "all")
WITH_CHECKPOINTS = ("attention", "theta")
WITHOUT_CHECKPOINTS = ("decay", "wavelength", "sinusoidal", "collisions")  # what `all` runs
DEFAULT_OUT = Path("docs/results/analysis")
YARN_ALPHA, YARN_BETA = 1.0, 32.0  # YaRN's ramp boundaries (Peng et al. 2023)
DPI = 120


# ---------------------------------------------------------------------------------------------
# RoPE: decay bound and wavelengths


def rope_thetas(head_dim: int, base: float) -> np.ndarray:
    """θ_i = base^(−2i/d), i = 0..d/2−1, float64 (as poslab.positions.rope.rope_theta)."""
    return float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def decay_distances(max_distance: int = 16384, dense: int = 256, points: int = 512) -> np.ndarray:
    """Every integer distance below `dense`, then `points` log-spaced integers (and every power of
    two) up to and including `max_distance` (a log axis shows them evenly)."""
    near = np.arange(min(dense, max_distance + 1))
    if max_distance < dense:
        return near
    far = np.geomspace(dense, max_distance, points).round().astype(np.int64)
    powers = 2 ** np.arange(int(math.log2(max_distance)) + 1)  # landmarks: 256, 1024, 16384
    return np.unique(np.concatenate([near, far, powers, [max_distance]]))


def decay_bound(distances: np.ndarray, head_dim: int, base: float) -> np.ndarray:
    """(1/(d/2))·Σ_{j=1..d/2} |S_j|, S_j = Σ_{i<j} e^{i·r·θ_i}, for every distance r (float64,
    vectorised: a cumulative sum of complex exponentials over i)."""
    r = np.asarray(distances, dtype=np.float64)[:, None]
    partial_sums = np.cumsum(np.exp(1j * r * rope_thetas(head_dim, base)), axis=1)  # S_1..S_d/2
    return np.abs(partial_sums).mean(axis=1)


def wavelengths(head_dim: int, base: float) -> np.ndarray:
    """λ_i = 2π/θ_i = 2π·base^(2i/d), i = 0..d/2−1: the tokens one turn of pair i takes.

    A check against the seed FAQ, which quotes for d = 512 "i = 0 → 6.28, i = 128 → 316,
    i = 256 → 15811". No natural convention with base 10000 gives all three: i = 0 → 2π holds in
    every one, but this convention (poslab's, RoFormer's) gives 2π·100 ≈ 628 at i = 128 and has no
    i = 256 (i stops at d/2 − 1 = 255); 2π·10000^(i/d) gives 62.8 and 628; π·10000^(2i/d) gives
    314 at i = 128 but π at i = 0. The three numbers are one geometric sequence (each ×≈50 per
    128 indices, as every convention's is), and match this formula with base ≈ 2500
    (2π·2500^(2i/512): 6.28, 314, 15708, within 0.7%): the FAQ's base, not its shape, is off.
    tests/test_analysis.py checks what holds."""
    return 2 * math.pi / rope_thetas(head_dim, base)


def yarn_ramp(ratio: np.ndarray, alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> np.ndarray:
    """YaRN's γ_i = clamp((r_i − α)/(β − α), 0, 1) for r_i = L/λ_i: 0 interpolates the frequency
    fully (fewer than α turns within L), 1 keeps it (more than β turns)."""
    return np.clip((np.asarray(ratio) - alpha) / (beta - alpha), 0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# sinusoidal positions


def sinusoidal_similarity(max_distance: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """p_0·p_r/(d/2) for r = 0..max_distance (= the cosine similarity, and p_n·p_{n+r}/(d/2) for
    any n), from the vectors of poslab's sinusoidal scheme (`sinusoidal_table`, fp32) with the
    dot products in float64."""
    from poslab.positions.sinusoidal import sinusoidal_table

    table = sinusoidal_table(torch.arange(max_distance + 1), d_model, base).double().numpy()
    return table @ table[0] / (d_model / 2)


# ---------------------------------------------------------------------------------------------
# attention of trained checkpoints


@dataclass
class AttentionStats:
    """Per (layer, head) statistics of one forward, and checks of the weights."""

    mean_distance: np.ndarray  # (n_layer, n_head): Σ_n w_mn·(m − n), mean over all queries
    mass_beyond: np.ndarray  # (n_layer, n_head): Σ_{m−n ≥ L} w_mn, mean over queries m ≥ L
    max_row_error: float  # max over queries of |Σ_n w_mn − 1|
    max_future_weight: float  # max weight on a key after its query (0 for causal attention)


class AttentionRecorder(Blockwise):
    """The blockwise kernel (the reference weights, every scheme hook applied) that also records,
    per layer and head, the mean attention distance and the mass on keys at distance ≥ L."""

    name = "recorder"

    def __init__(self, train_length: int, n_layer: int, n_head: int, block_size: int = 1024):
        super().__init__(block_size)
        self.train_length = train_length
        self.distance_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.far_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.queries = torch.zeros(n_layer, dtype=torch.float64)
        self.far_queries = torch.zeros(n_layer, dtype=torch.float64)
        self.max_row_error = 0.0
        self.max_future_weight = 0.0

    def weights(
        self, q: Tensor, k: Tensor, pos: Any, prepared: Any, layer: int, start: int, end: int
    ) -> Tensor:
        """Blockwise's weights of one query block (its __call__ runs the blocks), recorded."""
        weights = super().weights(q, k, pos, prepared, layer, start, end)
        self.record(weights, layer, start, end)
        return weights

    def record(self, weights: Tensor, layer: int, start: int, end: int) -> None:
        """Add the statistics of weights (B, H, end − start, end) of queries start..end−1."""
        w = weights.double()
        m = torch.arange(start, end, device=w.device)[:, None]
        n = torch.arange(end, device=w.device)[None, :]
        distance = (m - n).double()  # (Tq, Tk); negative above the diagonal: future keys
        far = (distance >= self.train_length).double()
        self.distance_sum[layer] += torch.einsum("bhqk,qk->h", w, distance.clamp(min=0)).cpu()
        self.far_sum[layer] += torch.einsum("bhqk,qk->h", w, far).cpu()
        self.queries[layer] += w.shape[0] * (end - start)
        self.far_queries[layer] += w.shape[0] * max(0, end - max(start, self.train_length))
        self.max_row_error = max(self.max_row_error, float((w.sum(-1) - 1).abs().max()))
        future = (distance < 0).expand_as(w)
        if future.any():
            self.max_future_weight = max(self.max_future_weight, float(w[future].abs().max()))

    def stats(self) -> AttentionStats:
        far = self.far_queries[:, None]
        mass = torch.where(far > 0, self.far_sum / far.clamp(min=1), torch.nan)
        return AttentionStats(
            (self.distance_sum / self.queries[:, None].clamp(min=1)).numpy(),
            mass.numpy(),
            self.max_row_error,
            self.max_future_weight,
        )


def attention_statistics(
    model: Any, ids: Tensor, train_length: int, block_size: int = 1024
) -> AttentionStats:
    """Run `model` (fp32, inference mode) on token ids (B, T) with the recording kernel installed
    as model.attention (checked against the scheme first), then put its kernel back. A model
    whose attention is not softmax has no softmax weights to record: a ConfigError."""
    if not model.attention.softmax:
        raise ConfigError(
            f"attention={model.attention.name}: the model has no softmax attention weights to "
            "measure; the attention analysis takes softmax checkpoints"
        )
    recorder = AttentionRecorder(
        train_length, model.config.n_layer, model.config.n_head, block_size
    )
    recorder.check(model.pos, 0.0)
    original = model.attention
    model.attention = recorder
    try:
        with torch.inference_mode():
            model.float().hidden_states(ids)
    finally:
        model.attention = original
    return recorder.stats()


def uniform_reference(length: int, train_length: int) -> tuple[float, float]:
    """(mean distance, mass beyond L) of uniform causal attention over `length` tokens."""
    m = np.arange(length, dtype=np.float64)
    past = m[m >= train_length]
    mass = float(np.mean((past - train_length + 1) / (past + 1))) if past.size else math.nan
    return float(np.mean(m / 2)), mass


class UnsupportedLength(ConfigError):
    """The scheme cannot represent the analysed length (learned positions beyond their table)."""


def checkpoint_path(path: str | Path) -> Path:
    """A .ckpt file as given, or the best (else last) checkpoint of a run folder (as
    poslab.evaluation.run.checkpoint_of_run, whose module imports Lightning: seconds that a
    mistyped path should not wait for)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (p / "checkpoints" / name).is_file():
                return p / "checkpoints" / name
        raise ConfigError(
            f"run folder {p} has no checkpoints/best.ckpt or last.ckpt; pass a .ckpt file "
            "or a run folder whose training saved a checkpoint"
        )
    raise ConfigError(
        f"no such checkpoint or run folder: {p}; pass .ckpt files or run folders holding "
        "checkpoints/best.ckpt or last.ckpt"
    )


def check_attention_input(path: str | Path, factor: float, data_path: str | None) -> None:
    """What would stop the attention analysis of one checkpoint, found before any model runs
    (and before the output folder is made): a checkpoint of a generated task (no corpus to run
    on), windows too short to hold a query and a key, a corpus that is gone."""
    from poslab.build import read_checkpoint

    ckpt = checkpoint_path(path)
    data = read_checkpoint(ckpt)["hyper_parameters"]["config"].get("data") or {}
    if data.get("task"):
        raise ConfigError(
            f"{path} was trained on the generated task data={data.get('name')}, not on a text "
            "corpus: the attention analysis runs a model on windows of its training corpus; pass "
            "checkpoints trained on text (data=text, wikitext2 or wikitext103)"
        )
    train_length = int(data["seq_len"])
    if round(factor * train_length) < 2:
        raise ConfigError(
            f"--factor {factor:g} × the training length {train_length} of {path} is fewer than "
            "2 tokens, no window to measure; raise --factor"
        )
    stored = data.get("path")
    if data_path is None and stored and not Path(str(stored)).expanduser().exists():
        raise ConfigError(
            f"{path} was trained on data.path={stored}, which does not exist any more; pass that "
            "corpus with --data-path DIR"
        )


def scheme_name(config: dict[str, Any]) -> str:
    from poslab.evaluation.run import scheme_label

    return scheme_label(config)


def validation_windows(
    config: dict[str, Any], length: int, windows: int, split: str = "validation",
    data_path: str | None = None, vocab_size: int | None = None,
) -> Tensor:  # fmt: skip
    """(windows, length) token ids of the run's corpus, windows spread evenly over the split."""
    from poslab.data import TokenCache

    overrides = {"path": data_path} if data_path else {}
    cache = TokenCache.from_config(config["data"], **overrides)
    if vocab_size is not None and cache.meta()["vocab_size"] != vocab_size:
        raise ConfigError(
            f"the token cache {cache.folder} has a vocabulary of {cache.meta()['vocab_size']} "
            f"but the checkpoint was trained with {vocab_size}; pass the corpus it was trained "
            "on (--data-path) with the same tokenizer settings"
        )
    ids = np.asarray(cache.split(split).ids, dtype=np.int64)
    if len(ids) < length:
        raise ConfigError(
            f"the {split} split has {len(ids)} tokens, fewer than one window of {length}; "
            "lower --factor"
        )
    starts = np.linspace(0, len(ids) - length, windows).round().astype(np.int64)
    return torch.from_numpy(np.stack([ids[s : s + length] for s in starts]))


def analyse_checkpoint(
    path: str | Path, factor: float = 4.0, windows: int = 4, split: str = "validation",
    data_path: str | None = None, block_size: int = 1024,
) -> list[dict]:  # fmt: skip
    """One row per (layer, head) of a checkpoint (see the module doc). A scheme that cannot
    represent the length (learned positions beyond their table) is a ConfigError."""
    from poslab.build import load_checkpoint

    ckpt = checkpoint_path(path)
    model, config = load_checkpoint(ckpt)
    train_length = int(config["data"]["seq_len"])
    length = round(factor * train_length)
    try:
        model.pos.check_length(length - 1)
    except ConfigError as err:
        raise UnsupportedLength(f"{scheme_name(config)} at T={length}: {err}") from None
    ids = validation_windows(config, length, windows, split, data_path, model.config.vocab_size)
    stats = attention_statistics(model, ids, train_length, block_size)
    if stats.max_row_error > 1e-4 or stats.max_future_weight > 0:
        raise RuntimeError(
            f"{ckpt}: attention weights are not causal probabilities (row sums off by "
            f"{stats.max_row_error:.2g}, future weight {stats.max_future_weight:.2g})"
        )
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    return [
        {"scheme": scheme_name(config), "run": run, "checkpoint": str(ckpt),
         "train_length": train_length, "eval_length": length, "windows": windows,
         "layer": layer, "head": head,
         "mean_distance": float(stats.mean_distance[layer, head]),
         "mass_beyond_L": float(stats.mass_beyond[layer, head])}
        for layer in range(stats.mean_distance.shape[0])
        for head in range(stats.mean_distance.shape[1])
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the analyses: CSV + PNG each


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def run_decay(out: Path, bases: list[float], head_dims: list[int], max_distance: int) -> list:
    distances = decay_distances(max_distance)
    rows: list[dict] = []
    fig, axes = plt.subplots(1, len(head_dims), figsize=(5.5 * len(head_dims), 4), squeeze=False)
    for ax, d in zip(axes[0], head_dims, strict=True):
        for base in bases:
            bound = decay_bound(distances, d, base)
            rows += [{"distance": int(r), "base": base, "head_dim": d, "bound": float(b)}
                     for r, b in zip(distances, bound, strict=True)]  # fmt: skip
            ax.plot(distances[1:], bound[1:], lw=0.8, label=f"base {base:g}")
        ax.set_xscale("log")
        ax.set_xlabel("relative distance m − n")
        ax.set_ylabel("(1/(d/2))·Σ_j |S_j|")
        ax.set_title(f"head dim d = {d} (bound at 0: {(d / 2 + 1) / 2:g})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("RoPE long-range decay bound")
    fig.tight_layout()
    save(fig, rows, out, "decay")
    for d in head_dims:
        for base in bases:
            mine = [r for r in rows if r["head_dim"] == d and r["base"] == base]
            at = {r["distance"]: r["bound"] for r in mine}
            near = [at[r] for r in (0, 16, 128, 1024, 16384) if r in at]
            spans = [(1, 16), (256, 1024), (max_distance // 2, max_distance)]
            spans = [(lo, hi) for lo, hi in spans if any(lo <= r <= hi for r in at)]  # not empty
            means = [np.mean([b for r, b in at.items() if lo <= r <= hi]) for lo, hi in spans]
            spread = ", ".join(
                f"{lo}–{hi}: {m:.2f}" for (lo, hi), m in zip(spans, means, strict=True)
            )
            values = " / ".join(f"{b:.2f}" for b in near)
            print(f"decay d={d} base={base:g}: bound at 0/16/128/1024/16384 = {values}; "
                  f"mean over {spread}", flush=True)  # fmt: skip
    return rows


def run_wavelength(
    out: Path, bases: list[float], head_dims: list[int], train_length: int
) -> list[dict]:
    rows: list[dict] = []
    fig, axes = plt.subplots(1, len(head_dims), figsize=(5.5 * len(head_dims), 4), squeeze=False)
    for ax, d in zip(axes[0], head_dims, strict=True):
        for base in bases:
            lam = wavelengths(d, base)
            ratio = train_length / lam
            gamma = yarn_ramp(ratio)
            rows += [{"base": base, "head_dim": d, "i": i, "theta": 2 * math.pi / lam[i],
                      "wavelength": float(lam[i]), "train_length": train_length,
                      "ratio": float(ratio[i]), "full_period": bool(lam[i] <= train_length),
                      "yarn_gamma": float(gamma[i])}
                     for i in range(len(lam))]  # fmt: skip
            index = np.arange(len(lam))
            full = lam <= train_length
            (line,) = ax.plot(index, lam, lw=1, label=f"base {base:g}: {full.sum()} of "
                              f"{len(lam)} pairs turn within L")  # fmt: skip
            ax.scatter(index[full], lam[full], s=8, color=line.get_color())
            ax.scatter(index[~full], lam[~full], s=8, facecolors="none",
                       edgecolors=line.get_color())  # fmt: skip
            print(f"wavelength d={d} base={base:g} L={train_length}: {full.sum()}/{len(lam)} "
                  f"pairs with λ ≤ L; {(ratio > YARN_BETA).sum()} with r > β={YARN_BETA:g} "
                  f"(kept by YaRN), {(ratio < YARN_ALPHA).sum()} with r < α={YARN_ALPHA:g} "
                  f"(interpolated); λ_max = {lam[-1]:.0f}")  # fmt: skip
        ax.axhline(train_length / YARN_ALPHA, color="k", ls="--", lw=0.8,
                   label=f"λ = L/α = {train_length} (r = α = 1)")  # fmt: skip
        ax.axhline(train_length / YARN_BETA, color="k", ls=":", lw=0.8,
                   label=f"λ = L/β = {train_length / YARN_BETA:g} (r = β = 32)")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("frequency index i (θ_i = base^(−2i/d))")
        ax.set_ylabel("wavelength λ_i = 2π/θ_i (tokens)")
        ax.set_title(f"head dim d = {d}; filled: λ_i ≤ L = {train_length}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("RoPE wavelengths against the training length (YaRN's r_i = L/λ_i)")
    fig.tight_layout()
    save(fig, rows, out, "wavelength")
    return rows


def run_sinusoidal(
    out: Path, d_models: list[int], max_distance: int, base: float = 10000.0
) -> list[dict]:
    rows: list[dict] = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    zoom = min(128, max_distance)
    for d in d_models:
        sim = sinusoidal_similarity(max_distance, d, base)
        rows += [{"distance": r, "d_model": d, "base": base, "similarity": float(s)}
                 for r, s in enumerate(sim)]  # fmt: skip
        for ax, last in zip(axes, (max_distance, zoom), strict=True):
            ax.plot(np.arange(last + 1), sim[: last + 1], lw=0.8, label=f"d_model = {d}")
        marks = [r for r in (0, 1, 16, 128, 512, 2048) if r <= max_distance]
        print(f"sinusoidal d={d}: similarity at {'/'.join(map(str, marks))} = "
              + " / ".join(f"{sim[r]:.3f}" for r in marks)
              + f"; min {sim.min():.3f} at {int(sim.argmin())}")  # fmt: skip
    for ax, last in zip(axes, (max_distance, zoom), strict=True):
        ax.set_xlim(0, last)
        ax.set_xlabel("relative distance m − n")
        ax.set_ylabel("p_m·p_n / (d/2)  (= cosine similarity)")
        ax.axhline(0, color="k", lw=0.5)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_title(f"0..{max_distance}")
    axes[1].set_title(f"0..{zoom}")
    fig.suptitle(f"Sinusoidal positions (base {base:g}): similarity against distance")
    fig.tight_layout()
    save(fig, rows, out, "sinusoidal")
    return rows


def position_collisions(length: int, dtype: str, d_model: int = 512, n_head: int = 8) -> dict:
    """What the positions 0..length−1 become with pos.position_dtype=`dtype` (module doc)."""
    from poslab.positions import build_scheme

    positions = torch.arange(length)
    rope = build_scheme("rope", d_model, n_head, position_dtype=dtype)
    values = rope.prepare(positions).fp32
    angles = rope.angles(values)
    alibi = build_scheme("alibi", d_model, n_head, position_dtype=dtype)
    exact = build_scheme("alibi", d_model, n_head)
    last, keys = positions[-1:], positions
    wrong = alibi.attention_bias(last, keys) != exact.attention_bias(last, keys)  # (H, 1, T)
    return {
        "length": length, "position_dtype": dtype,
        "exact_positions": float((values == positions.float()).float().mean()),
        "distinct_angle_vectors": angles.unique(dim=0).shape[0] / length,
        "wrong_alibi_distances": float(wrong[0, 0].float().mean()),
    }  # fmt: skip


def run_collisions(out: Path, max_length: int) -> list[dict]:
    lengths = [n for n in (2**k for k in range(8, 20)) if n <= max_length] or [max_length]
    rows = [position_collisions(n, dtype) for dtype in ("fp32", "bf16") for n in lengths]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, style in (("exact_positions", "-o"), ("distinct_angle_vectors", "--s"),
                       ("wrong_alibi_distances", ":^")):  # fmt: skip
        for dtype in ("fp32", "bf16"):
            mine = [r for r in rows if r["position_dtype"] == dtype]
            ax.plot([r["length"] for r in mine], [r[key] for r in mine], style,
                    label=f"{key} ({dtype})", alpha=0.8 if dtype == "bf16" else 0.4)  # fmt: skip
    for r in rows:
        if r["position_dtype"] == "bf16":
            print(f"collisions bf16 N={r['length']}: exact {r['exact_positions']:.3f}, distinct "
                  f"angles {r['distinct_angle_vectors']:.3f}, wrong alibi distances "
                  f"{r['wrong_alibi_distances']:.3f}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("positions 0..N−1")
    ax.set_ylabel("fraction")
    ax.set_title("Positions computed in bf16 (pos.position_dtype=bf16) vs fp32")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, rows, out, "collisions")
    return rows


def run_attention(
    out: Path, paths: list[str], factor: float, windows: int, split: str,
    data_path: str | None, block_size: int,
) -> list[dict]:  # fmt: skip
    for p in paths:  # every path checked before any model is run
        check_attention_input(p, factor, data_path)
    rows: list[dict] = []
    for p in paths:
        try:
            rows += analyse_checkpoint(p, factor, windows, split, data_path, block_size)
        except UnsupportedLength as err:
            if len(paths) == 1:
                raise
            print(f"skipped {p}: {err}", file=sys.stderr, flush=True)
    if not rows:
        raise ConfigError(f"no checkpoint could be analysed at {factor:g}× its training length")
    names = [r["scheme"] for r in rows if r["layer"] == 0 and r["head"] == 0]
    for r in rows:  # two runs of one scheme: tell them apart by run folder
        if names.count(r["scheme"]) > 1:
            r["scheme"] = f"{r['scheme']} [{r['run']}]"
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    metrics = (("mean_distance", "mean attention distance (tokens)"),
               ("mass_beyond_L", "attention mass at distance ≥ L"))  # fmt: skip
    styles = line_styles(len(schemes))
    for k, scheme in enumerate(schemes):
        mine = [r for r in rows if r["scheme"] == scheme]
        shift = 0.05 * (k - (len(schemes) - 1) / 2)  # heads' dots side by side, not on top
        layers = sorted({r["layer"] for r in mine})
        means = {key: [np.mean([r[key] for r in mine if r["layer"] == la]) for la in layers]
                 for key, _ in metrics}  # fmt: skip
        for ax, (key, _) in zip(axes, metrics, strict=True):
            (line,) = ax.plot(layers, means[key], label=scheme, **styles[k])
            heads = ([r["layer"] + shift for r in mine], [r[key] for r in mine])
            ax.scatter(*heads, s=10, alpha=0.35, color=line.get_color())
        summary = "; ".join(
            f"layer {la}: distance {d:.1f}, mass ≥L {m:.3f}"
            for la, d, m in zip(layers, means["mean_distance"], means["mass_beyond_L"], strict=True)
        )
        print(f"attention {scheme} (L={mine[0]['train_length']}, T={mine[0]['eval_length']}): "
              f"{summary}")  # fmt: skip
    if rows:
        lengths = {(r["eval_length"], r["train_length"]) for r in rows}
        if len(lengths) == 1:
            ((length, train_length),) = lengths
            uniform = uniform_reference(length, train_length)
            for ax, value in zip(axes, uniform, strict=True):
                ax.axhline(value, color="grey", ls="--", lw=0.8, label="uniform causal attention")
            print(f"uniform causal attention at T={length}, L={train_length}: distance "
                  f"{uniform[0]:.1f}, mass ≥L {uniform[1]:.3f}")  # fmt: skip
            fig.suptitle(f"Attention on {split} text at T = {length} = {factor:g}× L "
                         f"(L = {train_length}, {windows} windows): line = mean over heads, "
                         "dots = heads", fontsize=10)  # fmt: skip
    for ax, (_, label) in zip(axes, metrics, strict=True):
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    save(fig, rows, out, "attention")
    return rows


def theta_ratio_rows(pos: Any, variant: str, run: str, seed: Any) -> list[dict]:
    """θ_i/θ_i(init) per frequency of a rotary scheme with a learnable θ."""
    ratio = (pos.frequencies().detach().cpu() / pos.theta_init.cpu()).tolist()
    return [{"run": run, "variant": variant, "seed": seed, "index": i,
             "theta_init": float(pos.theta_init[i]), "ratio": r}
            for i, r in enumerate(ratio)]  # fmt: skip


def theta_rows(path: str | Path) -> list[dict]:
    """θ_i/θ_i(init) per frequency of one checkpoint (a ConfigError if its θ is fixed)."""
    from poslab.build import load_checkpoint

    ckpt = checkpoint_path(path)
    model, config = load_checkpoint(ckpt)
    pos = model.pos
    if not hasattr(pos, "frequencies") or getattr(pos, "theta_param", None) is None:
        raise ConfigError(f"{path} has no learnable θ (train with pos.learnable_theta=true)")
    variant = f"{scheme_name(config)} θ {pos.theta_param}"
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    return theta_ratio_rows(pos, variant, run, config.get("seed"))


def run_theta(out: Path, paths: list[str]) -> list[dict]:
    rows: list[dict] = []
    for p in paths:
        rows += theta_rows(p)
    plot_theta(rows, out)
    return rows


def plot_theta(rows: list[dict], out: Path) -> Path:
    """theta.png (one line per run: colour = variant, style = seed) and theta.csv in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colours: dict[str, Any] = {}  # one colour per variant, one line style per seed
    seen: dict[str, int] = {}
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        variant = mine[0]["variant"]
        nth = seen[variant] = seen.get(variant, -1) + 1
        (line,) = ax.plot([r["index"] for r in mine], [r["ratio"] for r in mine], marker=".",
                          color=colours.get(variant), ls=("-", "--", ":", "-.")[nth % 4],
                          label=f"{variant}, seed {mine[0]['seed']}", alpha=0.8)  # fmt: skip
        colours.setdefault(variant, line.get_color())
        ratios = np.array([r["ratio"] for r in mine])
        print(
            f"theta {variant} seed {mine[0]['seed']} ({run}): θ/θ0 from {ratios.min():.3g} to "
            f"{ratios.max():.3g}, max |log ratio| {np.abs(np.log(np.abs(ratios))).max():.3g}"
        )
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_xlabel("frequency index i (θ_i = base^(−2i/R) at init)")
    ax.set_ylabel("θ_i / θ_i(init) after training")
    ax.set_title("Learnable θ: how far training moved each frequency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, rows, out, "theta")
    return out / "theta.png"


def save(fig: Any, rows: list[dict], out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)  # only now: a failed analysis leaves no empty folder
    if rows:
        write_csv(out / f"{name}.csv", rows)
    fig.savefig(out / f"{name}.png", dpi=DPI)
    plt.close(fig)
    print(f"wrote {out / name}.png and {name}.csv", flush=True)


# ---------------------------------------------------------------------------------------------
# the command line


def parser() -> argparse.ArgumentParser:
    """Bad arguments: one `error: ...` line and exit code 2, as every poslab entry point."""
    p = OneLineParser(
        prog="scripts/analysis.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("analysis", help=f"one of: {', '.join(ANALYSES)} (all: the first three)")
    p.add_argument("checkpoints", nargs="*", help="attention, theta: .ckpt files or run folders")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    p.add_argument("--bases", type=float, nargs="+", default=[100.0, 10000.0, 500000.0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--max-distance", type=int, default=16384,
                   help="decay, collisions (default 16384)")  # fmt: skip
    p.add_argument("--train-length", type=int, default=512, help="wavelength: L (default 512)")
    p.add_argument("--d-models", type=int, nargs="+", default=[256], help="sinusoidal")
    p.add_argument("--sin-distance", type=int, default=2048, help="sinusoidal (default 2048)")
    p.add_argument("--factor", type=float, default=4.0, help="attention: T = factor × L")
    p.add_argument("--windows", type=int, default=4, help="attention: windows of T tokens")
    p.add_argument("--split", default="validation", choices=("train", "validation", "test"),
                   help="attention: corpus split")  # fmt: skip
    p.add_argument("--data-path", default=None, help="attention: corpus, if not the stored one")
    p.add_argument("--block-size", type=int, default=1024, help="attention: query block")
    return p


def check_args(args: argparse.Namespace) -> None:
    if args.analysis not in ANALYSES:
        raise ConfigError(
            f"unknown analysis {args.analysis!r}; choose one of {', '.join(ANALYSES)}"
        )
    if args.analysis in WITH_CHECKPOINTS and not args.checkpoints:
        raise ConfigError(f"{args.analysis} needs checkpoints: pass .ckpt files or run folders")
    if args.analysis not in WITH_CHECKPOINTS and args.checkpoints:
        raise ConfigError(
            f"{args.analysis} takes no checkpoints (got {' '.join(args.checkpoints)}); "
            f"only {' and '.join(WITH_CHECKPOINTS)} do"
        )
    positive = {"--head-dims": min(args.head_dims), "--max-distance": args.max_distance,
                "--train-length": args.train_length, "--d-models": min(args.d_models),
                "--sin-distance": args.sin_distance, "--windows": args.windows,
                "--block-size": args.block_size}  # fmt: skip
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} must be ≥ 1 (got {value})")
    for name, dims in (("--head-dims", args.head_dims), ("--d-models", args.d_models)):
        if any(d % 2 for d in dims):
            raise ConfigError(f"{name} must be even (pairs of dims), got {dims}")
    if not all(math.isfinite(b) and b > 1 for b in args.bases):
        raise ConfigError(f"--bases must be finite and > 1 (got {args.bases})")
    if not (math.isfinite(args.factor) and args.factor > 0):
        raise ConfigError(f"--factor must be finite and > 0 (got {args.factor})")
    if args.data_path is not None and not Path(args.data_path).expanduser().exists():
        raise ConfigError(
            f"--data-path {args.data_path} does not exist; pass the corpus folder the "
            "checkpoints were trained on"
        )
    check_writable(args.out, "--out")


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    check_args(args)
    todo = WITHOUT_CHECKPOINTS if args.analysis == "all" else (args.analysis,)
    if args.analysis in WITH_CHECKPOINTS:
        for p in args.checkpoints:  # every path, before the first one is analysed
            checkpoint_path(p)
    # the output folder is made by the first analysis that writes (save)
    for name in todo:
        if name == "decay":
            run_decay(args.out, args.bases, args.head_dims, args.max_distance)
        elif name == "wavelength":
            run_wavelength(args.out, args.bases, args.head_dims, args.train_length)
        elif name == "sinusoidal":
            run_sinusoidal(args.out, args.d_models, args.sin_distance)
        elif name == "collisions":
            run_collisions(args.out, args.max_distance)
        elif name == "theta":
            run_theta(args.out, args.checkpoints)
        else:
            run_attention(args.out, args.checkpoints, args.factor, args.windows, args.split,
                          args.data_path, args.block_size)  # fmt: skip
