"""A learnable θ after training: θ_i/θ_i(init) of every rotary frequency, as rows and a plot.

The rotary scheme writes them after training (RotaryPositions.after_training) and the `theta`
analysis for checkpoints (poslab.analysis.theta); both import them from here, beneath either.
matplotlib is imported by the plot only, so that importing a scheme stays cheap.
"""

from __future__ import annotations

import csv
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
    """theta.png (one line per run: colour = variant, style = seed) and theta.csv in `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    colours: dict[str, Any] = {}  # one colour per variant, one line style per seed
    seen: dict[str, int] = {}
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        variant, seed = mine[0]["variant"], mine[0]["seed"]
        nth = seen[variant] = seen.get(variant, -1) + 1
        (line,) = ax.plot(
            [r["index"] for r in mine],
            [r["ratio"] for r in mine],
            marker=".",
            color=colours.get(variant),
            ls=("-", "--", ":", "-.")[nth % 4],
            label=f"{variant}, seed {seed}",
            alpha=0.8,
        )
        colours.setdefault(variant, line.get_color())
        ratios = np.array([r["ratio"] for r in mine])
        print(
            f"theta {variant} seed {seed} ({run}): θ/θ0 from {ratios.min():.3g} to "
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
    if rows:
        with (out / "theta.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    fig.savefig(out / "theta.png", dpi=DPI)
    plt.close(fig)
    print(f"wrote {out / 'theta'}.png and theta.csv", flush=True)
    return out / "theta.png"
