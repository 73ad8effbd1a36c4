"""Result rows as figures: perplexity (or accuracy) against evaluation length, loss by position in
the window, and a task's condition × length heatmap. Non-finite values are never plotted; a
footnote names them. Callers save and close the figures (files.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from poslab.evaluation.tables import NONFINITE, is_finite, is_nonfinite  # noqa: E402

# a log y-axis when the largest perplexity is at least this many times the smallest (see
# ppl_yaxis for why)
LOG_AXIS_MIN_RATIO = 3.0


def series_label(row: dict, series_key: str, several_modes: bool) -> str:
    if series_key == "mode" or not several_modes:
        return str(row[series_key])
    return f"{row[series_key]} ({row['mode']})"


def plain_number(value: float) -> str:
    """A tick label without offset or scientific notation: 20, 1,000, 13,300, 0.5."""
    if value >= 10:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def length_xaxis(ax: Axes) -> None:
    """Lengths and positions on a log2 axis, labelled as numbers (256, 1,024), not as powers:
    what a reader compares with the training length (and no mathtext to typeset)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def ppl_yaxis(ax: Axes, values: Iterable[float]) -> str:
    """Scale and label the perplexity axis of `ax` for `values`; returns "log" or "linear".

    A log axis when the values span at least LOG_AXIS_MIN_RATIO× (the ALiBi paper's plots: a
    sinusoidal model going from 20 to 2,000 next to flat ones), a linear one when the range is
    narrower: a log axis over less than a factor 3 has no decade tick and only a few minor ones,
    and matplotlib's ScalarFormatter on it falls back to offset/scientific notation (values
    13,290-13,340 were labelled -1 ... 6); a linear axis with the offset and scientific notation
    switched off labels such a range 13,290, 13,300, ... Every label is a plain number: on a log
    axis decades always, minor ticks all when the axis spans less than a decade, only 2× and 5×
    when it spans up to 2.5 decades, and none beyond (then at least 3 decades are labelled).
    """
    finite = [v for v in values if is_finite(v) and v > 0]
    if not finite:
        return "linear"
    lo, hi = min(finite), max(finite)
    if hi / lo < LOG_AXIS_MIN_RATIO:
        formatter = matplotlib.ticker.ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        ax.yaxis.set_major_formatter(formatter)
        if lo == hi:  # one value: a visible range around it instead of matplotlib's ±5%-of-zero
            ax.set_ylim(lo * 0.95, hi * 1.05)
        return "linear"
    ax.set_yscale("log")
    decades = math.log10(hi / lo)
    labelled = (
        set(range(2, 10)) if decades < 1 else {2, 5} if decades < 2.5 else set()
    )  # the minor ticks that get a label, by their mantissa

    def minor(value: float, _pos: object = None) -> str:
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        return plain_number(value) if mantissa in labelled else ""

    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10))
    ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))
    return "log"


def no_data_note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")


def dropped_note(fig: Figure, dropped: list[tuple[str, int]]) -> None:
    """A footnote naming the (series, length) points left out of a plot because their values
    are non-finite: "not plotted (nonfinite): alibi L=512, 1024"."""
    by_series: dict[str, list[int]] = {}
    for label, length in dropped:
        by_series.setdefault(label, []).append(length)
    if by_series:
        names = "; ".join(
            f"{label} L={', '.join(map(str, sorted(set(ns))))}" for label, ns in by_series.items()
        )
        fig.text(0.01, 0.01, f"not plotted (nonfinite): {names}", fontsize=7, color="grey")


def line_styles(n: int) -> list[dict]:
    """n distinguishable line styles: 10 colours, then the same colours dashed, then dotted."""
    colours = plt.get_cmap("tab10").colors
    dashes, markers = ("-", "--", ":"), ("o", "s", "^")
    return [
        {"color": colours[i % 10], "ls": dashes[i // 10 % 3], "marker": markers[i // 10 % 3]}
        for i in range(n)
    ]


def sd_band(ax: Axes, points: list[tuple[float, float, float]], color: Any) -> None:
    """A shaded band of ± one sd around (x, mean, sd) points (rows merged over seeds)."""
    if points:
        xs, means, sds = zip(*points, strict=True)
        lows = [m - s for m, s in zip(means, sds, strict=True)]
        highs = [m + s for m, s in zip(means, sds, strict=True)]
        ax.fill_between(xs, lows, highs, color=color, alpha=0.15, lw=0)


def ppl_figure(rows: list[dict], series_key: str, title: str) -> Figure:
    """The figure of `plot_ppl_vs_length` (callers close it). Non-finite perplexities are left
    out; with none finite the axes say so. With several series a second panel shows each one
    relative to its perplexity at the training length (or its shortest length), so schemes of
    different levels compare by shape, and the legend goes beside the panels."""
    several_modes = len({r["mode"] for r in rows}) > 1
    series: dict[str, list] = {}
    spread: dict[str, dict[int, tuple]] = {}  # label -> length -> (ppl sd, ratio, ratio sd)
    dropped: list[tuple[str, int]] = []
    for r in rows:
        label = series_label(r, series_key, several_modes)
        if is_nonfinite(r) or (r["status"] == "ok" and not is_finite(r.get("ppl"))):
            dropped.append((label, r["length"]))
        elif r["status"] == "ok" and r["ppl"] > 0:
            series.setdefault(label, []).append((r["length"], r["ppl"]))
            if r.get("n_seeds", 1) > 1 and is_finite(r.get("ppl_sd")):
                spread.setdefault(label, {})[r["length"]] = (
                    r["ppl_sd"],
                    r.get("ratio"),
                    r.get("ratio_sd"),
                )
    compare = len(series) > 1
    fig, axes = plt.subplots(1, 2 if compare else 1, figsize=(12.5, 4.6) if compare else (6.4, 4.2))
    axes = list(axes) if compare else [axes]
    ax = axes[0]
    train_lengths = {r["train_length"] for r in rows}
    for (label, pts), style in zip(series.items(), line_styles(len(series)), strict=True):
        pts = sorted(pts)
        ax.plot(*zip(*pts, strict=True), label=label, **style)
        band = [(n, p, *spread[label][n]) for n, p in pts if n in spread.get(label, {})]
        sd_band(ax, [(n, p, sd) for n, p, sd, _, _ in band], style["color"])
        if compare:
            ref = next((p for n, p in pts if n in train_lengths), pts[0][1])
            axes[1].plot([n for n, _ in pts], [p / ref for _, p in pts], label=label, **style)
            ratios = [(n, r, sd) for n, _, _, r, sd in band if is_finite(r) and is_finite(sd)]
            sd_band(axes[1], ratios, style["color"])
    for a in axes:
        for n in train_lengths:
            a.axvline(n, color="grey", ls=":", lw=1)
        length_xaxis(a)
        a.set_xlabel("evaluation length (tokens); dotted: training length")
        a.grid(True, which="both", alpha=0.3)
    ppl_yaxis(ax, [ppl for pts in series.values() for _, ppl in pts])
    if not series:
        no_data_note(ax, "no finite perplexity to plot")
    ax.set_ylabel("perplexity")
    ax.set_title(title)
    if compare:
        axes[1].axhline(1.0, color="grey", lw=0.8)
        axes[1].set_ylabel("perplexity ÷ perplexity at the training length")
        axes[1].set_title("relative to the training length (shape)")
        axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    elif series:
        ax.legend()
    fig.tight_layout(rect=(0, 0.04 if dropped else 0, 1, 1))  # room for the footnote
    dropped_note(fig, dropped)
    return fig


def log_binned(buckets: list[list], bins_per_octave: int = 6) -> tuple[list[float], list[float]]:
    """Token-weighted mean loss in log-spaced position bins (a readable curve on a log axis
    from the fine, equal-width buckets stored in the results). Buckets with a non-finite mean
    are left out."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for start, mean, count in buckets:
        if not is_finite(mean) or not count:
            continue
        b = int(math.floor(math.log2(start + 1) * bins_per_octave))
        sums[b] = sums.get(b, 0.0) + mean * count
        counts[b] = counts.get(b, 0) + count
    keys = sorted(sums)
    return [2 ** ((b + 0.5) / bins_per_octave) for b in keys], [sums[b] / counts[b] for b in keys]


def position_figure(rows: list[dict], title: str) -> Figure:
    """The figure of `plot_loss_vs_position` (callers close it)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plotted = 0
    dropped: list[tuple[str, int]] = []
    for r in rows:
        if r["status"] not in ("ok", NONFINITE) or not r.get("loss_by_position"):
            continue
        xs, ys = ([], []) if is_nonfinite(r, "loss") else log_binned(r["loss_by_position"])
        if not xs:
            dropped.append((str(r["scheme"]), r["length"]))
            continue
        ax.plot(xs, ys, label=f"{r['scheme']} L={r['length']}", lw=1.4)
        plotted += 1
    for n in {r["train_length"] for r in rows}:
        ax.axvline(n, color="grey", ls=":", lw=1)
    length_xaxis(ax)
    if not plotted:
        no_data_note(ax, "no finite loss to plot")
    ax.set_xlabel("position in window (+1); dotted: training length")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if plotted:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout(rect=(0, 0.04 if dropped else 0, 1, 1))  # room for the footnote
    dropped_note(fig, dropped)
    return fig


def accuracy_figure(rows: list[dict], series_key: str, title: str) -> Figure:
    """Exact-match and token accuracy against evaluation length (log-x), one line per series,
    with a ± sd band for rows merged over seeds (callers close the figure)."""
    several_modes = len({r["mode"] for r in rows}) > 1
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6))
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok" and is_finite(r.get("accuracy")):
            label = series_label(r, series_key, several_modes)
            if r.get("learned") is False:  # shown, but marked: it is not judged beyond L
                label += " (did not learn at L)"
            series.setdefault(label, []).append(r)
    for (label, pts), style in zip(series.items(), line_styles(len(series)), strict=True):
        pts = sorted(pts, key=lambda r: r["length"])
        if pts[0].get("learned") is False:
            style = {**style, "ls": ":", "alpha": 0.6}
        for ax, value in zip(axes, ("accuracy", "token_accuracy"), strict=True):
            ax.plot([r["length"] for r in pts], [r[value] for r in pts], label=label, **style)
            if any(r.get("n_seeds", 1) > 1 for r in pts):
                band = [(r["length"], r[value], r.get(f"{value}_sd") or 0.0) for r in pts]
                sd_band(ax, band, style["color"])
    chances = {r["mode"]: r["token_chance"] for r in rows if is_finite(r.get("token_chance"))}
    for ax, what in zip(axes, ("whole answer right", "answer tokens right"), strict=True):
        for n in {r["train_length"] for r in rows}:
            ax.axvline(n, color="grey", ls=":", lw=1)
        length_xaxis(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("evaluation length (tokens); dotted: training length")
        ax.set_ylabel(f"accuracy ({what})")
        ax.grid(True, which="both", alpha=0.3)
        if not series:
            no_data_note(ax, "no accuracy to plot")
    for mode, chance in chances.items():  # a uniform guess, per task
        label = "chance" if len(chances) == 1 else f"chance ({mode})"
        axes[1].axhline(chance, color="grey", ls="--", lw=1, label=label)
    for mode in dict.fromkeys(r["mode"] for r in rows):  # the best stated shortcut, per length
        best: dict[int, list[dict]] = {}
        for r in rows:
            if r["mode"] == mode and r["status"] == "ok" and is_finite(r.get("shortcut")):
                best.setdefault(r["length"], []).append(r)
        if best:
            lengths = sorted(best)
            label = "best shortcut" + ("" if len(chances) <= 1 else f" ({mode})")
            for ax, value in zip(axes, ("shortcut", "shortcut_token"), strict=True):
                means = [np.mean([r[value] for r in best[n]]) for n in lengths]
                ax.plot(lengths, means, color="black", ls="-.", lw=1, label=label)
    axes[0].set_title(title)
    axes[1].set_title("per answer token")
    if series:
        axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig


def heatmap_figure(rows: list[dict], series_key: str, title: str) -> Figure | None:
    """Accuracy by condition (rows of the image, e.g. the passkey's depth) and evaluation length
    (columns), one panel per series; None when the rows have no conditions."""
    several_modes = len({r["mode"] for r in rows}) > 1
    panels: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("by_condition"):
            panels.setdefault(series_label(r, series_key, several_modes), []).append(r)
    if not panels:
        return None
    n = len(panels)
    cols = min(n, 4)
    width = max(6.4, 3.6 * cols)  # room for the title above a single panel
    fig, axes = plt.subplots(
        math.ceil(n / cols), cols, figsize=(width, 3.2 * math.ceil(n / cols) + 0.4), squeeze=False
    )
    image = None
    for ax, (label, pts) in zip(axes.flat, panels.items(), strict=False):
        pts = sorted(pts, key=lambda r: r["length"])
        conditions = [c["condition"] for c in pts[0]["by_condition"]]
        grid = np.array([[c["accuracy"] for c in r["by_condition"]] for r in pts]).T
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(pts)), [str(r["length"]) for r in pts], fontsize=7)
        key = next(iter(conditions[0]), "")
        ax.set_yticks(range(len(conditions)), [f"{c.get(key, '')}" for c in conditions], fontsize=7)
        ax.set_xlabel("evaluation length")
        ax.set_ylabel(key)
        ax.set_title(label, fontsize=9)
        for (y, x), value in np.ndenumerate(grid):
            ax.text(
                x,
                y,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if value < 0.5 else "black",
            )
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), shrink=0.8, label="accuracy")
    return fig
