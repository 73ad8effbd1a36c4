"""RoPE's long-range decay bound (RoFormer): the part of the Abel-summation bound on |q·k| that
depends on the relative distance r, for several bases and head dims (cli.py's doc)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from poslab.analysis.figures import plt, save


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


def run_decay(out: Path, bases: list[float], head_dims: list[int], max_distance: int) -> list:
    distances = decay_distances(max_distance)
    rows: list[dict] = []
    fig, axes = plt.subplots(1, len(head_dims), figsize=(5.5 * len(head_dims), 4), squeeze=False)
    for ax, d in zip(axes[0], head_dims, strict=True):
        for base in bases:
            bound = decay_bound(distances, d, base)
            rows += [
                {"distance": int(r), "base": base, "head_dim": d, "bound": float(b)}
                for r, b in zip(distances, bound, strict=True)
            ]
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
            print(
                f"decay d={d} base={base:g}: bound at 0/16/128/1024/16384 = {values}; "
                f"mean over {spread}",
                flush=True,
            )
    return rows
