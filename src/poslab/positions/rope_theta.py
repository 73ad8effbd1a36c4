"""A learnable θ after training: θ_i/θ_i(init) of every rotary frequency, as rows and a plot.

The rotary scheme writes them after training (RotaryPositions.after_training) and the `theta`
analysis for checkpoints (poslab.analysis.theta); both import them from here, beneath either.
matplotlib is imported by the plot only, so that importing a scheme stays cheap.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

DPI = 120  # as the analysis figures


def theta_ratio_rows(pos: Any, variant: str, run: str, seed: Any) -> list[dict]:
    """θ_i/θ_i(init) per frequency of a rotary scheme with a learnable θ."""
    ratio = (pos.frequencies().detach().cpu() / pos.theta_init.cpu()).tolist()
    return [
        {
            "run": run,
            "variant": variant,
            "seed": seed,
            "index": i,
            "theta_init": float(pos.theta_init[i]),
            "ratio": r,
        }
        for i, r in enumerate(ratio)
    ]


def plot_theta(rows: list[dict], out: Path) -> Path:
    """theta.png (theta_figure) and theta.csv in `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig = theta_figure(rows)
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        variant, seed = mine[0]["variant"], mine[0]["seed"]
        ratios = np.array([float(r["ratio"]) for r in mine])
        print(
            f"theta {variant} seed {seed} ({run}): θ/θ0 from {ratios.min():.3g} to "
            f"{ratios.max():.3g}, max |log ratio| {np.abs(np.log(np.abs(ratios))).max():.3g}"
        )
    if rows:
        with (out / "theta.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    fig.savefig(out / "theta.png", dpi=DPI)
    plt.close(fig)
    print(f"wrote {out / 'theta'}.png and theta.csv", flush=True)
    return out / "theta.png"


def theta_figure(rows: list[dict]) -> Any:
    """θ_i/θ_i(init) against i, one line per run: colour = variant, marker and dash = its seed
    among the variant's runs (unique for any number of runs). A symlog axis (raw θ can change
    sign) whose limits hold every value, with decade ticks labelled as plain numbers."""
    import matplotlib.ticker

    from poslab.plotting import COLOURS, MARKERS, dash, finish_figure, new_figure

    fig = new_figure(7.0, 4.4)
    ax = fig.subplots()
    variants: list[str] = []
    seen: dict[str, int] = {}
    handles = []
    values: list[float] = []
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        variant, seed = mine[0]["variant"], mine[0]["seed"]
        if variant not in variants:
            variants.append(variant)
        v = variants.index(variant)
        nth = seen[variant] = seen.get(variant, -1) + 1
        pattern = nth + 36 * (v // 10)  # (marker, dash) unique per colour: 9 × 4 combinations
        ratios = [float(r["ratio"]) for r in mine]
        values += ratios
        (line,) = ax.plot(
            [int(r["index"]) for r in mine],
            ratios,
            color=COLOURS[v % 10],
            marker=MARKERS[pattern % 9],
            ls=dash(pattern % 4 if pattern < 36 else pattern),
            markersize=4,
            label=f"{variant}, seed {seed}",
            alpha=0.8,
        )
        handles.append(line)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    linthresh = 1e-2
    ax.set_yscale("symlog", linthresh=linthresh)
    if values:
        ax.set_ylim(*symlog_limits(min(values + [1.0]), max(values + [1.0]), linthresh))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: signed_number(v)))
    ax.set_xlabel("frequency index i (θ_i = base^(−2i/R) at init)")
    ax.set_ylabel("θ_i / θ_i(init) after training (symlog)")
    ax.set_title("Learnable θ: how far training moved each frequency")
    ax.grid(True, alpha=0.3)
    return finish_figure(fig, handles, [h.get_label() for h in handles])


def symlog_limits(lo: float, hi: float, linthresh: float) -> tuple[float, float]:
    """Axis limits holding [lo, hi] on a symlog axis with 5% of the transformed span to spare
    on each side (matplotlib's own margins on symlog can cut the largest value off)."""

    def forward(x: float) -> float:
        a = abs(x)
        return math.copysign(a / linthresh if a <= linthresh else 1 + math.log10(a / linthresh), x)

    def inverse(y: float) -> float:
        a = abs(y)
        return math.copysign(a * linthresh if a <= 1 else linthresh * 10 ** (a - 1), y)

    f_lo, f_hi = forward(lo), forward(hi)
    pad = 0.05 * max(f_hi - f_lo, 1.0)
    return inverse(f_lo - pad), inverse(f_hi + pad)


def signed_number(value: float) -> str:
    """A symlog tick label: 0, 0.01, 1, 100, 1,000, −100 (no mathtext powers)."""
    if value == 0:
        return "0"
    a = abs(value)
    text = f"{a:,.0f}" if a >= 10 else f"{a:g}"
    return ("−" if value < 0 else "") + text
