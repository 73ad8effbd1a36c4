"""RoPE's long-range decay bound (RoFormer): the part of the Abel-summation bound on |q·k| that
depends on the relative distance r, for several bases and head dims (cli.py's doc)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from poslab.analysis.figures import save
from poslab.plotting import finish_figure, new_figure, sparse_marks, styles_for


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


def decay_rows(bases: list[float], head_dims: list[int], max_distance: int) -> list[dict]:
    distances = decay_distances(max_distance)
    return [
        {"distance": int(r), "base": base, "head_dim": d, "bound": float(b)}
        for d in head_dims
        for base in bases
        for r, b in zip(distances, decay_bound(distances, d, base), strict=True)
    ]


def decay_figure(rows: list[dict]) -> Figure:
    """One panel per head dim, one line per base (from distance 1: the log axis), from the rows
    (decay.csv)."""
    head_dims = list(dict.fromkeys(int(r["head_dim"]) for r in rows))
    bases = list(dict.fromkeys(float(r["base"]) for r in rows))
    styles = styles_for(f"base {b:g}" for b in bases)
    fig = new_figure(5.5 * len(head_dims), 4.2)
    axes = fig.subplots(1, len(head_dims), squeeze=False)
    handles = []
    for ax, d in zip(axes[0], head_dims, strict=True):
        for base in bases:
            mine = [r for r in rows if int(r["head_dim"]) == d and float(r["base"]) == base]
            mine = sorted((r["distance"], r["bound"]) for r in mine if r["distance"] > 0)
            label = f"base {base:g}"
            marks = sparse_marks([x for x, _ in mine], log=True)
            style = {**styles[label], "lw": 0.8, "markersize": 4, "markevery": marks}
            (line,) = ax.plot(*zip(*mine, strict=True), label=label, **style)
            if ax is axes[0][0]:
                handles.append(line)
        ax.set_xscale("log")
        ax.set_xlabel("relative distance m − n")
        ax.set_ylabel("(1/(d/2))·Σ_j |S_j|")
        ax.set_title(f"head dim d = {d} (bound at 0: {(d / 2 + 1) / 2:g})")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("RoPE long-range decay bound")
    return finish_figure(fig, handles, [h.get_label() for h in handles])


def run_decay(out: Path, bases: list[float], head_dims: list[int], max_distance: int) -> list:
    rows = decay_rows(bases, head_dims, max_distance)
    fig = decay_figure(rows)
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
            print(
                f"decay d={d} base={base:g}: bound at 0/16/128/1024/16384 = {values}; "
                f"mean over {spread}",
                flush=True,
            )
    return rows
