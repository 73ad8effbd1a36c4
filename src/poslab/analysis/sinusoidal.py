"""The similarity p_m·p_n/(d/2) of sinusoidal position vectors against m − n (cli.py's doc)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from poslab.analysis.figures import save
from poslab.plotting import finish_figure, new_figure, sparse_marks, styles_for


def sinusoidal_similarity(max_distance: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """p_0·p_r/(d/2) for r = 0..max_distance (= the cosine similarity, and p_n·p_{n+r}/(d/2) for
    any n), from the vectors of poslab's sinusoidal scheme (`sinusoidal_table`, fp32) with the
    dot products in float64."""
    from poslab.positions.sinusoidal import sinusoidal_table

    table = sinusoidal_table(torch.arange(max_distance + 1), d_model, base).double().numpy()
    return table @ table[0] / (d_model / 2)


def run_sinusoidal(
    out: Path, d_models: list[int], max_distance: int, base: float = 10000.0
) -> list[dict]:
    rows: list[dict] = []
    for d in d_models:
        sim = sinusoidal_similarity(max_distance, d, base)
        rows += [
            {"distance": r, "d_model": d, "base": base, "similarity": float(s)}
            for r, s in enumerate(sim)
        ]
        marks = [r for r in (0, 1, 16, 128, 512, 2048) if r <= max_distance]
        print(
            f"sinusoidal d={d}: similarity at {'/'.join(map(str, marks))} = "
            + " / ".join(f"{sim[r]:.3f}" for r in marks)
            + f"; min {sim.min():.3f} at {int(sim.argmin())}"
        )
    save(sinusoidal_figure(rows), rows, out, "sinusoidal")
    return rows


def sinusoidal_figure(rows: list[dict]) -> Figure:
    """The similarity against distance, all of it and its first 128 tokens, one line per
    d_model; from the rows (sinusoidal.csv)."""
    d_models = list(dict.fromkeys(int(r["d_model"]) for r in rows))
    base = float(rows[0]["base"])
    max_distance = max(int(r["distance"]) for r in rows)
    zoom = min(128, max_distance)
    styles = styles_for(f"d_model = {d}" for d in d_models)
    fig = new_figure(11, 4.2)
    axes = fig.subplots(1, 2)
    handles = []
    for d in d_models:
        sim = np.array(
            [
                float(r["similarity"])
                for r in sorted(rows, key=lambda r: int(r["distance"]))
                if int(r["d_model"]) == d
            ]
        )
        label = f"d_model = {d}"
        for ax, last in zip(axes, (max_distance, zoom), strict=True):
            marks = sparse_marks(range(last + 1))
            style = {**styles[label], "lw": 0.8, "markersize": 4, "markevery": marks}
            (line,) = ax.plot(np.arange(last + 1), sim[: last + 1], label=label, **style)
        handles.append(line)
    for ax, last in zip(axes, (max_distance, zoom), strict=True):
        ax.set_xlim(0, last)
        ax.set_xlabel("relative distance m − n")
        ax.set_ylabel("p_m·p_n / (d/2)  (= cosine similarity)")
        ax.axhline(0, color="k", lw=0.5)
        ax.grid(True, alpha=0.3)
    axes[0].set_title(f"0..{max_distance}")
    axes[1].set_title(f"0..{zoom}")
    fig.suptitle(f"Sinusoidal positions (base {base:g}): similarity against distance")
    return finish_figure(fig, handles, [h.get_label() for h in handles])
