"""Result rows as figures: perplexity (or accuracy) against evaluation length, loss by position in
the window, and a task's condition × length heatmap. Non-finite values are never plotted; a
footnote names them. Callers save and close the figures (files.py).

The line styles, coinciding series, bands, log ticks and layout are poslab.plotting's (what
keeps a figure readable); every figure of one report gets the styles of `report_styles`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import matplotlib.ticker
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D

from poslab.plotting import (  # re-exported: callers and tests import them from here
    COINCIDE_RTOL,
    Hidden,
    NiceLogLocator,
    band_limits,
    coincide_label,
    coincide_note,
    coinciding,
    finish_figure,
    fit_limits,
    hidden_style,
    hidden_text,
    line_styles,
    natural_key,
    natural_sorted,
    near_span,
    new_figure,
    plain_number,
    sd_band,
    series_lines,
    sparse_marks,
    style_for_index,
    styles_for,
    text_artists,
    wrap,
)
from poslab.report.families import BEST_TITLE, MOST_ROWS, panel_groups
from poslab.report.seeds import mean_sd
from poslab.report.tables import NONFINITE, is_finite, is_nonfinite, learning_note

__all__ = [
    "COINCIDE_RTOL",
    "NiceLogLocator",
    "accuracy_figure",
    "band_limits",
    "context_figure",
    "heatmap_figure",
    "line_styles",
    "natural_key",
    "natural_sorted",
    "plain_number",
    "position_figure",
    "ppl_figure",
    "ppl_yaxis",
    "report_styles",
    "sd_band",
    "series_lines",
    "style_for_index",
    "styles_for",
    "text_artists",
]

# a log y-axis when the largest perplexity is at least this many times the smallest (see
# ppl_yaxis for why)
LOG_AXIS_MIN_RATIO = 3.0
# how a report's default title ends ("perplexity vs evaluation length"): it says which
# quantity, not which experiment, so a figure of another quantity drops it (figure_title)
GENERIC_TITLE = "vs evaluation length"


# ---------------------------------------------------------------- series, order and styles


def series_label(row: dict, series_key: str, several_modes: bool) -> str:
    if series_key == "mode" or not several_modes:
        return str(row[series_key])
    return f"{row[series_key]} ({row['mode']})"


def series_id(row: dict, series_key: str) -> tuple[str, str]:
    """What a series is, whatever its label in one figure: (its `series_key` value, its mode)."""
    return (str(row[series_key]), str(row["mode"]))


def report_styles(rows: Iterable[dict], series_key: str) -> dict[tuple[str, str], dict]:
    """The style of every series of a report (keyed by series_id), to pass to each of its figures
    so that a scheme looks the same in all of them."""
    return styles_for(series_id(r, series_key) for r in rows)


# ---------------------------------------------------------------- axes


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
    switched off labels such a range 13,290, 13,300, ... Every label is a plain number. On a log
    axis NiceLogLocator puts labelled ticks inside the range of the data (not only decades and
    2×, 5×: ten schemes between 125 and 165 got no tick below 200); unlabelled minor ticks at
    2..9 × 10^k keep the grid.
    """
    finite = [v for v in values if is_finite(v) and v > 0]
    if not finite:
        return "linear"
    lo, hi = min(finite), max(finite)
    if hi / lo < LOG_AXIS_MIN_RATIO:
        formatter = matplotlib.ticker.ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        ax.yaxis.set_major_locator(
            matplotlib.ticker.MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3)
        )
        ax.yaxis.set_major_formatter(formatter)
        if lo == hi:  # one value: a visible range around it instead of matplotlib's ±5%-of-zero
            ax.set_ylim(lo * 0.95, hi * 1.05)
        return "linear"
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(NiceLogLocator(finite))
    ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    return "log"


def figure_title(what: str, title: str | None, noun: str) -> str:
    """A figure's title that names its quantity: the report's `title` when it names `noun`
    ("needle: accuracy vs evaluation length"), `what` alone in place of a generic title of
    another quantity (a loss-by-position figure of "perplexity vs evaluation length"), else the
    report's title over `what` (its first line says which experiment, the second what is drawn)."""
    if title and noun in title.lower():
        return title
    if not title or title.rstrip().endswith(GENERIC_TITLE):
        return what
    return f"{title}\n{what}"


def no_data_note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")


def dropped_text(dropped: list[tuple[str, int]]) -> str | None:
    """The footnote naming the (series, length) points left out of a plot because their values
    are non-finite: "not plotted (nonfinite): alibi L=512, 1024"."""
    by_series: dict[str, list[int]] = {}
    for label, length in dropped:
        by_series.setdefault(label, []).append(length)
    if not by_series:
        return None
    names = "; ".join(
        f"{label} L={', '.join(map(str, sorted(set(ns))))}" for label, ns in by_series.items()
    )
    return f"not plotted (nonfinite): {names}"


# ---------------------------------------------------------------- the figures


def rows_by_series(
    rows: list[dict], series_key: str, keep: Callable[[dict], bool]
) -> dict[str, list[dict]]:
    """The rows that `keep` accepts, grouped by their series label (with the mode in it when the
    rows have several modes), series in natural order and rows in their given order."""
    several_modes = len({r["mode"] for r in rows}) > 1
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        if keep(r):
            grouped.setdefault(series_label(r, series_key, several_modes), []).append(r)
    return {label: grouped[label] for label in natural_sorted(grouped)}


def length_panel(ax: Axes, train_lengths: Iterable[int]) -> None:
    """An evaluation-length x-axis on log2, with a dotted line at each training length (what a
    reader compares the lengths with) and a grid."""
    for n in train_lengths:
        ax.axvline(n, color="grey", ls=":", lw=1)
    length_xaxis(ax)
    ax.set_xlabel("evaluation length (tokens); dotted: training length")
    ax.grid(True, which="both", alpha=0.3)


class PerplexitySeries(NamedTuple):
    """What a perplexity figure draws, gathered from its rows by `perplexity_series`."""

    points: dict[str, list[tuple[int, float]]]  # label -> (length, ppl), by length
    ids: dict[str, tuple[str, str]]  # label -> series_id: the key of the report's styles
    spread: dict[str, dict[int, tuple]]  # label -> length -> (ppl sd, ratio, ratio sd)
    dropped: list[tuple[str, int]]  # (label, length) of the non-finite points


def perplexity_series(rows: list[dict], series_key: str) -> PerplexitySeries:
    """Each series' finite, positive perplexities (series in natural order), with the spread over
    seeds of rows merged over several seeds; non-finite points are listed, not plotted."""
    several_modes = len({r["mode"] for r in rows}) > 1
    series: dict[str, list[tuple[int, float]]] = {}
    ids: dict[str, tuple[str, str]] = {}
    spread: dict[str, dict[int, tuple]] = {}
    dropped: list[tuple[str, int]] = []
    for r in rows:
        label = series_label(r, series_key, several_modes)
        if is_nonfinite(r) or (r["status"] == "ok" and not is_finite(r.get("ppl"))):
            dropped.append((label, r["length"]))
        elif r["status"] == "ok" and r["ppl"] > 0:
            series.setdefault(label, []).append((r["length"], r["ppl"]))
            ids[label] = series_id(r, series_key)
            if r.get("n_seeds", 1) > 1 and is_finite(r.get("ppl_sd")):
                spread.setdefault(label, {})[r["length"]] = (
                    r["ppl_sd"],
                    r.get("ratio"),
                    r.get("ratio_sd"),
                )
    series = {label: sorted(series[label]) for label in natural_sorted(series)}
    return PerplexitySeries(series, ids, spread, dropped)


def _relative_to_training_length(
    series: dict[str, list[tuple[int, float]]], train_lengths: set[int]
) -> dict[str, list[tuple[int, float]]]:
    """Each series divided by its perplexity at the training length (or at its shortest length):
    its shape, comparable across schemes of different levels."""
    shapes: dict[str, list[tuple[int, float]]] = {}
    for label, pts in series.items():
        ref = next((p for n, p in pts if n in train_lengths), pts[0][1])
        shapes[label] = [(n, p / ref) for n, p in pts]
    return shapes


def _shape_yaxis(
    ax: Axes, shapes: dict[str, list[tuple[int, float]]], hidden: dict[str, Hidden]
) -> tuple[list[float], bool, dict[str, Hidden]]:
    """Scale the shape panel for the series' ratios; returns the ratios, whether the axis is log,
    and the series hidden on this panel only (those hidden on both the legend already names)."""
    ratios = [v for pts in shapes.values() for _, v in pts]
    shape_log = ppl_yaxis(ax, ratios) == "log"
    near = near_span(ratios, shape_log)
    shape_hidden = coinciding(shapes, near, shape_log, relative=True)
    return ratios, shape_log, {k: v for k, v in shape_hidden.items() if k not in hidden}


def _draw_perplexity_lines(
    axes: list[Axes],
    found: PerplexitySeries,
    shapes: dict[str, list[tuple[int, float]]],
    looks: dict[str, dict],
    hidden: dict[str, Hidden],
    hidden_shape: dict[str, Hidden],
) -> tuple[list[Line2D], list[list[float]]]:
    """Each series with its ± sd band on the perplexity panel and, when there is a second panel,
    its shape on that one (a series beneath a coinciding one in the hidden style); returns the
    legend's handles and each panel's band edges (for fit_limits)."""
    compare = len(axes) > 1
    handles = []
    edges: list[list[float]] = [[], []]  # the bands' edges, per panel
    for label, pts in found.points.items():
        style = looks[label]
        drawn = hidden_style(style) if label in hidden else style
        (line,) = axes[0].plot(
            *zip(*pts, strict=True), label=coincide_label(label, hidden), **drawn
        )
        handles.append(line)
        spread = found.spread.get(label, {})
        band = [(n, p, *spread[n]) for n, p in pts if n in spread]
        ppl_band = [(n, p, sd) for n, p, sd, _, _ in band]
        edges[0] += sd_band(axes[0], ppl_band, style["color"], "positive")
        if compare:
            shape_style = hidden_style(style) if label in hidden_shape else drawn
            axes[1].plot(*zip(*shapes[label], strict=True), label=label, **shape_style)
            spreads = [(n, r, sd) for n, _, _, r, sd in band if is_finite(r) and is_finite(sd)]
            edges[1] += sd_band(axes[1], spreads, style["color"], "positive")
    return handles, edges


def ppl_figure(rows: list[dict], series_key: str, title: str, styles: dict | None = None) -> Figure:
    """The figure of `plot_ppl_vs_length` (callers close it). Non-finite perplexities are left
    out; with none finite the axes say so. With several series a second panel shows each one
    relative to its perplexity at the training length (or its shortest length), so schemes of
    different levels compare by shape, and the legend goes beside or below the panels.
    `styles`: the report's (report_styles), so each series keeps its style across figures."""
    styles = styles or report_styles(rows, series_key)
    found = perplexity_series(rows, series_key)
    series = found.points
    compare = len(series) > 1
    fig = new_figure(12.5 if compare else 6.4, 4.6 if compare else 4.2)
    axes = list(fig.subplots(1, 2)) if compare else [fig.subplots()]
    ax = axes[0]
    train_lengths = {r["train_length"] for r in rows}
    shapes = _relative_to_training_length(series, train_lengths)
    values = [ppl for pts in series.values() for _, ppl in pts]
    log = ppl_yaxis(ax, values) == "log"
    hidden = coinciding(series, near_span(values, log), log, relative=True)
    ratios: list[float] = []
    shape_log, hidden_shape = False, {}
    if compare:
        ratios, shape_log, hidden_shape = _shape_yaxis(axes[1], shapes, hidden)
    looks = {label: styles.get(found.ids[label]) or styles_for(series)[label] for label in series}
    handles, edges = _draw_perplexity_lines(axes, found, shapes, looks, hidden, hidden_shape)
    for a in axes:
        length_panel(a, train_lengths)
    if not series:
        no_data_note(ax, "no finite perplexity to plot")
    ax.set_ylabel("perplexity")
    ax.set_title(figure_title("perplexity vs evaluation length", title, "perplexity"))
    cut = fit_limits(ax, values, edges[0], log)
    if compare:
        cut = fit_limits(axes[1], ratios, edges[1], shape_log) or cut
        axes[1].axhline(1.0, color="grey", lw=0.8)
        axes[1].set_ylabel("perplexity ÷ perplexity at the training length")
        axes[1].set_title("relative to the training length (shape)")
    notes = [
        coincide_note("right panel", hidden_shape) if compare else None,
        band_note(found.spread, cut),
        dropped_text(found.dropped),
    ]
    return finish_figure(fig, handles, [h.get_label() for h in handles], notes)


def band_note(spread: dict, cut: bool = False) -> str | None:
    if not spread:
        return None
    return (
        "shaded: ± 1 sd over seeds (below the mean as mean ÷ (1 + sd/mean), so that it stays "
        "above 0)"
        + ("; bands much wider than the lines' range are cut at the panel's edge" if cut else "")
    )


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


# The loss by position is a moving average in log position: buckets of 4 positions over a few
# hundred windows are noisy, and every row scores the same tokens at a position, so the raw
# buckets draw one sawtooth in every line. The window is SMOOTH_OCTAVES wide, moved in steps
# of 1/SMOOTH_STEPS octave.
SMOOTH_OCTAVES = 1.0
SMOOTH_STEPS = 4


def log_smoothed(
    buckets: list[list], octaves: float = SMOOTH_OCTAVES, steps: int = SMOOTH_STEPS
) -> tuple[list[float], list[float]]:
    """Token-weighted mean loss of the buckets within `octaves`/2 of points 1/`steps` octave
    apart (a moving average in log2(position + 1)), each at its buckets' token-weighted
    geometric mean position. A window holding the same buckets as the one before is left out,
    and so is one holding a single bucket (the first positions: one noisy bucket each) but for
    the first bucket (the token without context, a point of its own) and for buckets too
    sparse to make two points otherwise. Buckets with a non-finite mean are left out."""
    kept = [(math.log2(s + 1), m, c) for s, m, c in buckets if is_finite(m) and c]
    if not kept:
        return [], []
    logs = np.array([k[0] for k in kept])
    means = np.array([k[1] for k in kept])
    counts = np.array([k[2] for k in kept], dtype=float)
    windows: list[np.ndarray] = []
    for k in range(math.floor(logs.min() * steps), math.ceil(logs.max() * steps) + 1):
        inside = np.flatnonzero(np.abs(logs - k / steps) <= octaves / 2)
        if inside.size and not (windows and np.array_equal(windows[-1], inside)):
            windows.append(inside)
    wide = [w for w in windows if w.size > 1 or w[0] == 0]  # one bucket: only the first
    windows = wide if len(wide) >= 2 else windows
    weights = [counts[w] / counts[w].sum() for w in windows]
    xs = [float(2 ** (u @ logs[w])) for u, w in zip(weights, windows, strict=True)]
    ys = [float(u @ means[w]) for u, w in zip(weights, windows, strict=True)]
    return xs, ys


def seed_band(row: dict) -> list[tuple[float, float, float]] | None:
    """(position, mean, sd) over seeds of the smoothed loss by position, from the buckets of
    each seed a row keeps (per_seed["loss_by_position"]: {seed: buckets}); None when it keeps
    fewer than two (a merged row of seeds.py holds only their mean)."""
    by_seed = (row.get("per_seed") or {}).get("loss_by_position")
    if not isinstance(by_seed, dict) or len(by_seed) < 2:
        return None
    curves = []
    for buckets in by_seed.values():
        xs, ys = log_smoothed(buckets)
        curves.append({round(x, 6): y for x, y in zip(xs, ys, strict=True)})
    shared = sorted(set.intersection(*(set(c) for c in curves)))  # every seed has a value there
    return [(x, *mean_sd([c[x] for c in curves])) for x in shared]


class PositionCurves(NamedTuple):
    """What a loss-by-position figure draws, gathered from its rows by `position_curves`."""

    curves: dict[str, list[tuple[float, float]]]  # "<scheme> L=<length>" -> smoothed points
    keys: dict[str, Any]  # label -> series_id: the key of the report's styles
    rows: dict[str, dict]  # label -> its row
    bands: dict[str, list[tuple[float, float, float]]]  # label -> (x, mean, sd) over seeds
    unbanded: list[str]  # labels merged over seeds whose rows keep no per-seed buckets
    dropped: list[tuple[str, int]]  # (scheme, length) of rows with a non-finite loss


def position_curves(rows: list[dict], series_key: str = "scheme") -> PositionCurves:
    """Each row's smoothed loss by position (log_smoothed), labelled "<scheme> L=<length>", in
    natural order of (series, label), with its band over seeds where the row has one."""
    found = PositionCurves({}, {}, {}, {}, [], [])
    for r in rows:
        if r["status"] not in ("ok", NONFINITE) or not r.get("loss_by_position"):
            continue
        xs, ys = ([], []) if is_nonfinite(r, "loss") else log_smoothed(r["loss_by_position"])
        if not xs:
            found.dropped.append((str(r["scheme"]), r["length"]))
            continue
        label = f"{r['scheme']} L={r['length']}"
        found.curves[label] = list(zip(xs, ys, strict=True))
        found.keys[label] = series_id(r, series_key)
        found.rows[label] = r
        band = seed_band(r)
        if band:
            found.bands[label] = band
        elif int(r.get("n_seeds", 1) or 1) > 1:
            found.unbanded.append(label)
    order = natural_sorted(found.curves, key=lambda label: (*found.keys[label], label))
    curves = {label: found.curves[label] for label in order}
    return found._replace(curves=curves)


def position_notes(found: PositionCurves) -> list[str | None]:
    """The footnotes of a loss-by-position figure: how it is smoothed, its bands over seeds
    (or why a row merged over seeds has none), and the rows left out."""
    smoothing = (
        f"lines: token-weighted moving average over {SMOOTH_OCTAVES:g} octave of position "
        "(the raw buckets share one sawtooth: every row scores the same tokens at a position)"
    )
    band = "shaded: ± 1 sd over seeds of the smoothed loss" if found.bands else None
    which = "these rows" if not found.bands else ", ".join(found.unbanded)
    missing = (
        f"no band over seeds for {which}: merged over seeds, a row keeps only the mean of its "
        "seeds' loss by position, no per-seed buckets"
        if found.unbanded
        else None
    )
    return [smoothing, band, missing, dropped_text(found.dropped)]


def position_figure(
    rows: list[dict], title: str, styles: dict | None = None, series_key: str = "scheme"
) -> Figure:
    """The figure of `plot_loss_vs_position` (callers close it): one smoothed line per row
    (`position_curves`), labelled "<scheme> L=<length>", with its ± sd band over seeds where the
    row keeps per-seed buckets, in the report's style of its series (`styles`, keyed by
    series_id(row, series_key)) when every series has one row here, else in styles of its own."""
    found = position_curves(rows, series_key)
    curves, keys = found.curves, dict(found.keys)
    if styles is None or len(set(keys.values())) < len(keys):  # one series, several lines
        styles, keys = styles_for(curves), {label: label for label in curves}
    losses = [y for pts in curves.values() for _, y in pts]
    hidden = coinciding(curves, near_span(losses, False), relative=True)
    fig = new_figure(7.5, 4.4)
    ax = fig.subplots()
    handles = []
    for label, pts in curves.items():
        style = styles.get(keys[label]) or style_for_index(len(handles))
        handles.append(
            position_line(ax, pts, style, coincide_label(label, hidden), label in hidden)
        )
        sd_band(ax, found.bands.get(label, []), style["color"])
    position_axes(ax, rows)
    if not curves:
        no_data_note(ax, "no finite loss to plot")
    ax.set_title(figure_title(POSITION_TITLE, title, "loss by position"))
    labels = [h.get_label() for h in handles]
    return finish_figure(fig, handles, labels, position_notes(found))


POSITION_TITLE = "mean loss by position in the window (each row at its longest length)"


def position_line(
    ax: Axes, pts: list[tuple[float, float]], style: dict, label: str, hidden: bool
) -> Line2D:
    """One smoothed loss-by-position line, markers at about 12 positions spread in log x (a
    line beneath a coinciding one in the hidden style)."""
    marks = sparse_marks([x for x, _ in pts], log=True)
    style = {**style, "markevery": marks, "markersize": 4, "lw": 1.3}
    if hidden:
        style = hidden_style(style) | {"markersize": 7}
    (line,) = ax.plot(*zip(*pts, strict=True), label=label, **style)
    return line


def position_axes(ax: Axes, rows: list[dict], labels: bool = True) -> None:
    """A loss-by-position panel's log2 position axis, the training lengths dotted, its grid
    and (with `labels`) its axis labels."""
    for n in {r["train_length"] for r in rows}:
        ax.axvline(n, color="grey", ls=":", lw=1)
    length_xaxis(ax)
    if labels:
        ax.set_xlabel("position in window (+1); dotted: training length")
        ax.set_ylabel("mean loss (nats)")
    ax.grid(True, which="both", alpha=0.3)


def context_figure(rows: list[dict], series_key: str, styles: dict | None = None) -> Figure | None:
    """Context use (evaluation/context_use.py), for rows that measured it: left, each series'
    mean gain from the context beyond the short one (nats) against the evaluation length, ± 1 sd
    over seeds where merged; right, the gain by distance (log-binned) at each series' longest
    measured length. Above 0 the far context helps; a line at 0 ignores it; below 0 it harms.
    None when no row measured it."""
    measured = [r for r in rows if r["status"] == "ok" and is_finite(r.get("context_gain"))]
    if not measured:
        return None
    styles = styles or report_styles(measured, series_key)
    by_series: dict[tuple[str, str], list[dict]] = {}
    for r in measured:
        by_series.setdefault(series_id(r, series_key), []).append(r)
    fig = new_figure(12.5, 4.6)
    left, right = fig.subplots(1, 2)
    handles = []
    for index, (key, found) in enumerate(
        sorted(by_series.items(), key=lambda kv: natural_key(kv[0][1]))
    ):
        found.sort(key=lambda r: r["length"])
        style = {**(styles.get(key) or style_for_index(index)), "lw": 1.4}
        label = series_label(found[0], series_key, False)
        xs = [r["length"] for r in found]
        gains = [r["context_gain"] for r in found]
        (line,) = left.plot(xs, gains, label=label, **style)
        sds = [r.get("context_gain_sd") for r in found]
        if all(is_finite(sd) for sd in sds):
            low = [g - sd for g, sd in zip(gains, sds, strict=True)]
            high = [g + sd for g, sd in zip(gains, sds, strict=True)]
            left.fill_between(xs, low, high, color=line.get_color(), alpha=0.15, lw=0)
        handles.append(line)
        longest = found[-1]
        if longest.get("gain_by_distance"):
            bx, by = log_binned(longest["gain_by_distance"])
            right.plot(bx, by, **style)
    for ax in (left, right):
        for n in {r["train_length"] for r in measured}:
            ax.axvline(n, color="grey", ls=":", lw=1)
        ax.axhline(0.0, color="grey", lw=0.8)
        length_xaxis(ax)
        ax.grid(True, which="both", alpha=0.3)
    short = sorted({r.get("short_context") for r in measured if r.get("short_context")})
    beyond = f"beyond the last {short[0]} tokens" if len(short) == 1 else "beyond the short context"
    left.set_xlabel("evaluation length (tokens); dotted: training length")
    left.set_ylabel(f"mean gain from the context {beyond} (nats)")
    left.set_title("context use vs evaluation length")
    right.set_xlabel("distance of the token from its window's start (+1), at the longest length")
    right.set_ylabel("mean gain (nats)")
    right.set_title("gain by position in the window")
    notes = ["shaded: ± 1 sd over seeds; above 0 the far context helps, below 0 it harms"]
    return finish_figure(fig, handles, [h.get_label() for h in handles], notes)


def _accuracy_panels(
    series: dict[str, list[dict]], values: tuple[str, str]
) -> tuple[list[dict[str, list[tuple[int, float]]]], list[dict[str, Hidden]], dict[str, Hidden]]:
    """Each panel's finite (length, accuracy) points per series, the series hidden on each panel,
    and those hidden on both: the legend serves both panels, so it names a coincidence that
    holds in both, a note the rest."""
    panels = [
        {
            label: [(r["length"], r[value]) for r in pts if is_finite(r.get(value))]
            for label, pts in series.items()
        }
        for value in values
    ]
    hidden = [coinciding(p, near=0.004) for p in panels]  # 0.4% of the [0, 1] axis
    both = coinciding(
        {
            label: [((k, x), y) for k, p in enumerate(panels) for x, y in p[label]]
            for label in series
        },
        near=0.004,
    )
    return panels, hidden, both


def draw_accuracy_lines(
    axes: list[Axes],
    series: dict[str, list[dict]],
    values: tuple[str, str],
    series_key: str,
    styles: dict,
) -> tuple[list[Line2D], list[dict[str, Hidden]], dict[str, Hidden]]:
    """Each series on both panels, with a ± sd band (clipped to [0, 1]) when merged over seeds; a
    series that did not learn at L shown faded and marked. Returns the legend's handles (one per
    series), the series hidden on each panel and those hidden on both."""
    panels, hidden, both = _accuracy_panels(series, values)
    handles: list[Line2D] = []
    for label, pts in series.items():
        style = styles.get(series_id(pts[0], series_key)) or style_for_index(len(handles))
        shown = label
        if note := learning_note(pts[0]):  # shown, but marked: it is not judged beyond L
            shown += f" ({note})"
            style = {**style, "alpha": 0.55, "markerfacecolor": "none"}
        for k, (ax, value) in enumerate(zip(axes, values, strict=True)):
            drawn = hidden_style(style) if label in hidden[k] else style
            line_label = f"{shown} ({hidden_text(both[label])})" if label in both else shown
            xy = panels[k][label] or [(math.nan, math.nan)]
            (line,) = ax.plot(*zip(*xy, strict=True), label=line_label, **drawn)
            if k == 0:
                handles.append(line)
            elif label in hidden[0] and label not in hidden[1]:
                handles[-1] = line  # the legend shows the line as drawn where it is not hidden
            if any(r.get("n_seeds", 1) > 1 for r in pts):
                band = [(r["length"], r[value], r.get(f"{value}_sd") or 0.0) for r in pts]
                sd_band(ax, band, style["color"], "unit")
    return handles, hidden, both


def shortcut_lines(
    panels: list[tuple[Axes, str]], rows: list[dict], several_tasks: bool
) -> list[Line2D]:
    """The best shortcut the rows state (`shortcut`, `shortcut_token`: the best of the task's
    trivial predictors on the examples the models answered), mean over the rows at each length,
    per task, on each (axes, value) of `panels`; returns one legend handle per task."""
    handles = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        best: dict[int, list[dict]] = {}
        for r in rows:
            if r["mode"] == mode and r["status"] == "ok" and is_finite(r.get("shortcut")):
                best.setdefault(r["length"], []).append(r)
        if not best:
            continue
        lengths = sorted(best)
        label = "best shortcut" + (f" ({mode})" if several_tasks else "")
        for k, (ax, value) in enumerate(panels):
            means = [
                np.mean([r[value] for r in best[n] if is_finite(r.get(value))]) for n in lengths
            ]
            (line,) = ax.plot(lengths, means, color="black", ls="-.", lw=1, label=label)
            if k == 0:
                handles.append(line)
    return handles


def _accuracy_references(axes: list[Axes], rows: list[dict]) -> list[Line2D]:
    """What an accuracy is to be compared with: a uniform guess (chance, right panel) and the
    best shortcut the rows state (both panels), per task; returns their legend handles."""
    chances = {r["mode"]: r["token_chance"] for r in rows if is_finite(r.get("token_chance"))}
    references = []
    for mode, chance in chances.items():  # a uniform guess, per task
        label = "chance" if len(chances) == 1 else f"chance ({mode})"
        references.append(axes[1].axhline(chance, color="grey", ls="--", lw=1, label=label))
    panels = list(zip(axes, ("shortcut", "shortcut_token"), strict=True))
    return references + shortcut_lines(panels, rows, len(chances) > 1)


ACCURACY_TITLE = "accuracy (whole answer right) vs evaluation length"
SHORTCUT_NOTE = (
    "dash-dot: the best shortcut, a trivial predictor that reads only the prompt (the task's "
    "stated shortcuts), scored on the examples the models answered"
)


def accuracy_figure(
    rows: list[dict], series_key: str, title: str, styles: dict | None = None
) -> Figure:
    """Exact-match and token accuracy against evaluation length (log-x), one line per series,
    with a ± sd band (clipped to [0, 1]) for rows merged over seeds (callers close the figure).
    Accuracy is bounded: no ratio panel."""
    styles = styles or report_styles(rows, series_key)
    fig = new_figure(12.5, 4.6)
    axes = list(fig.subplots(1, 2))
    grouped = rows_by_series(
        rows, series_key, lambda r: r["status"] == "ok" and is_finite(r.get("accuracy"))
    )
    series = {label: sorted(pts, key=lambda r: r["length"]) for label, pts in grouped.items()}
    values = ("accuracy", "token_accuracy")
    handles, hidden, both = draw_accuracy_lines(axes, series, values, series_key, styles)
    for ax, what in zip(axes, ("whole answer right", "answer tokens right"), strict=True):
        length_panel(ax, {r["train_length"] for r in rows})
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(f"accuracy ({what})")
        if not series:
            no_data_note(ax, "no accuracy to plot")
    references = _accuracy_references(axes, rows)
    fig.suptitle(figure_title(ACCURACY_TITLE, title, "accuracy"))  # the width of both panels
    axes[0].set_title("whole answer right")
    axes[1].set_title("per answer token")
    notes = [
        coincide_note(side, {k: v for k, v in h.items() if k not in both})
        for side, h in zip(("left panel", "right panel"), hidden, strict=True)
    ]
    if any(r.get("n_seeds", 1) > 1 for pts in series.values() for r in pts):
        notes.append("shaded: ± 1 sd over seeds, clipped to [0, 1]")
    if series:
        handles += references
    if any(h.get_label().startswith("best shortcut") for h in references):
        notes.append(SHORTCUT_NOTE)
    return finish_figure(fig, handles, [h.get_label() for h in handles], notes)


def _seed_statistic(panels: dict[str, list[dict]]) -> str:
    """What a heatmap's cells are: "one seed", "mean over N seeds" when every panel has N, else
    a mean over the seeds each panel's title names."""
    seeds = {int(r.get("n_seeds", 1) or 1) for p in panels.values() for r in p}
    if len(seeds) == 1 and max(seeds, default=1) > 1:
        return f"mean over {seeds.pop()} seeds"
    if seeds == {1}:
        return "one seed"
    return "mean over the seeds in each panel's title"


def _write_cell_values(ax: Axes, grid: np.ndarray) -> None:
    """Each cell's accuracy written in it, in a colour that reads on the cell's."""
    for (y, x), value in np.ndenumerate(grid):
        ax.text(
            x,
            y,
            f"{value:.2f}",
            ha="center",
            va="center",
            fontsize=6,
            color="white" if value < 0.5 else "black",
            in_layout=False,  # inside its cell: nothing for the layout to make room for
        )


def _draw_heatmap_panel(
    ax: Axes, label: str, pts: list[dict], key: str, seeds_in_title: bool
) -> AxesImage:
    """One series' accuracy by condition (`key`, rows of the image) and length (columns), its
    values written in the cells, its number of seeds in the title when `seeds_in_title` (the
    panels differ in it); returns the image (for the colour bar)."""
    pts = sorted(pts, key=lambda r: r["length"])
    conditions = [c["condition"] for c in pts[0]["by_condition"]]
    grid = np.array([[c["accuracy"] for c in r["by_condition"]] for r in pts], dtype=float).T
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(pts)), [str(r["length"]) for r in pts], fontsize=7)
    ax.set_yticks(range(len(conditions)), [f"{c.get(key, '')}" for c in conditions], fontsize=7)
    ax.set_xlabel("evaluation length", fontsize=8)
    ax.set_ylabel(key, fontsize=8)
    panel_seeds = int(pts[0].get("n_seeds", 1) or 1)
    suffix = f" ({panel_seeds} seeds)" if seeds_in_title else ""
    ax.set_title(wrap(label + suffix, 40), fontsize=9)  # ~ a panel's width
    _write_cell_values(ax, grid)
    return image


def heatmap_figure(
    rows: list[dict], series_key: str, title: str | None = None, styles: dict | None = None
) -> Figure | None:
    """Accuracy by condition (rows of the image, e.g. the passkey's depth) and evaluation length
    (columns), one panel per series; None when the rows have no conditions. Titled for what it
    shows ("<task>: accuracy by <condition> and evaluation length", and "mean over N seeds" for
    rows merged over seeds); `title`, the report's, is kept as a first line when it is not the
    generic "...vs evaluation length" one. `styles` is accepted for symmetry (no lines here)."""
    panels = rows_by_series(
        rows, series_key, lambda r: r["status"] == "ok" and bool(r.get("by_condition"))
    )
    if not panels:
        return None
    first = next(iter(panels.values()))[0]
    key = next(iter(first["by_condition"][0]["condition"]), "condition")
    tasks = ", ".join(
        dict.fromkeys(str(r.get("task") or r["mode"]) for p in panels.values() for r in p)
    )
    statistic = _seed_statistic(panels)
    n = len(panels)
    cols = min(n, 4)
    nrows = math.ceil(n / cols)
    fig = new_figure(max(6.4, 3.4 * cols + 1.2), 3.0 * nrows + 0.9)
    axes = fig.subplots(nrows, cols, squeeze=False)
    image = None
    for ax, (label, pts) in zip(axes.flat, panels.items(), strict=False):
        image = _draw_heatmap_panel(ax, label, pts, key, "each panel" in statistic)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    what = f"{tasks}: accuracy (whole answer right) by {key} and evaluation length"
    heading = what + ("" if statistic == "one seed" else f", {statistic}")
    if title and not title.rstrip().endswith("vs evaluation length"):
        heading = f"{title}\n{heading}"
    fig.suptitle(heading, fontsize=10)
    if image is not None:
        fig.colorbar(
            image,
            ax=axes,
            shrink=0.8,
            label=f"accuracy, the whole answer right ({statistic})",
        )
    return finish_figure(fig)


# ---------------------------------------------------------------- differences to a baseline

# a row whose interval reaches more than this many times as far as the next row's goes off the
# panel's scale, drawn as an arrow at the edge with its value written (one diverged scheme would
# otherwise squeeze every other interval into a few pixels); only rows past the first three
# quarters can (of three rows, the top one)
OFF_SCALE_FACTOR = 4.0
# differences below this fraction of the baseline's own value count as 0 for that rule (rows of
# one checkpoint scored alike differ by float rounding, ~1e-7 relative)
RESOLUTION = 1e-4


def difference_limits(reach: list[float], floor: float = 0.0) -> float:
    """The half-width a difference panel shows, from each row's reach (max of |mean|, |low|,
    |high|, at least `floor`): all of them, but for the rows past the first three quarters (at
    least two rows kept) that reach more than OFF_SCALE_FACTOR times as far as the row before
    (those go off the scale)."""
    ordered = sorted(max(r, floor) for r in reach)
    if not ordered:
        return 1.0
    cut = len(ordered)
    for i in range(max(2, math.floor(0.75 * len(ordered))), len(ordered)):
        if ordered[i] > OFF_SCALE_FACTOR * ordered[i - 1]:
            cut = i
            break
    return max(ordered[cut - 1], 1e-9)


def difference_text(interval: Any, digits: int = 2) -> str:
    """+450.32, or +190.50 [−10.20, +391.20] with an interval."""
    parts = [interval.mean]
    if interval.low is not None and interval.high is not None:
        parts += [interval.low, interval.high]
    first, *bounds = (f"{v + 0.0:+,.{digits}f}".replace("-", "−") for v in parts)
    return f"{first} [{bounds[0]}, {bounds[1]}]" if bounds else first


def pairing_text(interval: Any) -> str:
    if interval is None:
        return "no difference"
    if interval.low is None or interval.high is None:
        return "1 seed"
    return f"{interval.n} {'paired' if interval.paired else 'unpaired'}"


def edge_arrow(ax: Axes, edge: float, y: float, span: float, colour: str, text: str) -> None:
    """An arrow pointing out of the panel at `edge` (a value off the scale), `text` beside it."""
    inward = -1.0 if edge >= 0 else 1.0  # the right edge points right, the left one left
    ax.annotate(
        "",
        xy=(edge, y),
        xytext=(edge + inward * 0.07 * span, y),
        arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.6, "mutation_scale": 12},
    )
    ax.text(
        edge + inward * 0.03 * span,
        y + 0.18,
        text,
        ha="right" if inward < 0 else "left",
        va="bottom",
        fontsize=7,
        color=colour,
    )


def _usable(interval: Any) -> bool:
    """A difference there is to draw: present, with a finite mean."""
    return interval is not None and math.isfinite(interval.mean)


def _ordered_schemes(found: Any, columns: list[int]) -> list[str]:
    """The schemes best first by their difference at the longest shown length; those without it
    by the next shorter one, and those with neither last."""
    sign = 1.0 if found.lower_is_better else -1.0

    def order_key(scheme: str) -> tuple:
        for rank, j in enumerate(reversed(columns)):
            if _usable(found.by_scheme[scheme][j]):
                return (rank, sign * found.by_scheme[scheme][j].mean)
        return (len(columns), 0.0)

    return sorted(found.by_scheme, key=order_key)


def _difference_window(found: Any, j: int, at: dict[str, Any]) -> tuple[float, float, float]:
    """The x-range of the panel at length index `j` for its intervals `at`: every interval and 0,
    but a far-off one (difference_limits) past the edge; returns (left, right, span)."""
    ends = {
        s: [v for v in (i.low, i.high) if v is not None and math.isfinite(v)] for s, i in at.items()
    }
    reach = [max(abs(v) for v in (i.mean, *ends[s])) for s, i in at.items()]
    floor = RESOLUTION * abs(found.base_values.get(found.lengths[j], 0.0))
    half = difference_limits(reach, floor) * 1.08
    lows = [min([i.mean, *ends[s]]) for s, i in at.items()]
    highs = [max([i.mean, *ends[s]]) for s, i in at.items()]
    left, right = max(-half, min(0.0, *lows) * 1.08), min(half, max(0.0, *highs) * 1.08)
    span = right - left or 1.0
    return left - 0.04 * span, right + 0.04 * span, span


def _draw_difference_row(
    ax: Axes,
    interval: Any,
    y: float,
    style: dict,
    window: tuple[float, float, float],
    text: str,
) -> bool:
    """One scheme's difference at height `y`: its interval as a bar with a cap at each end and
    its mean as a marker (filled when the interval excludes 0), or an arrow at the panel's edge
    with `text` where the mean or an end of the interval is off the scale. The caps are drawn
    whatever the interval's width: seeds that all gave one difference (width 0) show one cap
    through the marker, never the bare marker of a one-seed row. True when something was off
    the scale."""
    left, right, span = window
    colour = style["color"]
    if not left <= interval.mean <= right:  # the value itself is off the scale
        edge_arrow(ax, right if interval.mean > 0 else left, y, span, colour, text)
        return True
    off_scale = False
    has_ci = interval.low is not None and interval.high is not None
    if has_ci:
        low, high = max(interval.low, left), min(interval.high, right)
        ax.hlines(y, low, high, color=colour, lw=2)
        ends = [
            e for e, cut in ((low, low > interval.low), (high, high < interval.high)) if not cut
        ]
        interval_caps(ax, ends, y, colour)
        clipped = [
            e for e, cut in ((left, low > interval.low), (right, high < interval.high)) if cut
        ]
        for edge in clipped:  # an interval's end off the scale
            off_scale = True
            edge_arrow(ax, edge, y, span, colour, text if edge == clipped[-1] else "")
    filled = has_ci and interval.distinguishable
    ax.plot(
        interval.mean,
        y,
        marker=style["marker"],
        color=colour,
        mfc=colour if filled else "white",
        ms=7,
        ls="none",
    )
    return off_scale


# half the height of an interval's end caps, in rows
CAP = 0.3


def interval_caps(ax: Axes, ends: list[float], y: float, colour: Any) -> None:
    """An "I" at each end of an interval: a bar across the row with a serif at its top and
    bottom, drawn over the marker, so that an interval of width 0 (every seed gave the same
    difference) still reads as an interval, even on the line at 0, never as a bare marker."""
    ax.vlines(ends, y - CAP, y + CAP, color=colour, lw=1.5, zorder=2.5)
    serifs = [(e, end) for e in ends for end in (y - CAP, y + CAP)]
    if serifs:
        ax.plot(
            *zip(*serifs, strict=True),
            ls="none",
            marker="_",
            ms=7,
            mew=1.5,
            color=colour,
            zorder=2.5,
        )


def _draw_difference_panel(
    ax: Axes, found: Any, j: int, places: list[tuple[float, str]], looks: dict[str, dict]
) -> bool:
    """The panel of the length at index `j`: each (height, scheme) of `places` a row in the
    scheme's style (`looks`), the line at 0, titled by the length. True when a value was off the
    scale. The x-range is that of every scheme at `j` (_difference_window)."""
    at = {s: found.by_scheme[s][j] for s in found.by_scheme if _usable(found.by_scheme[s][j])}
    window = _difference_window(found, j, at)
    digits = 2 if found.metric == "ppl" else 3
    off_scale = False
    for y, scheme in places:
        if scheme in at:
            text = difference_text(at[scheme], digits)
            drawn = _draw_difference_row(ax, at[scheme], y, looks[scheme], window, text)
            off_scale = drawn or off_scale
    what = "perplexity" if found.metric == "ppl" else "accuracy"
    better = "(← better)" if found.lower_is_better else "(better →)"
    ax.axvline(0.0, color="grey", lw=1)
    ax.set_xlim(window[0], window[1])
    # few enough ticks that labels such as −0.010 never touch on a 4-inch panel
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    ax.grid(True, axis="x", alpha=0.3)
    n = found.lengths[j]
    factor = found.factors.get(n)
    ax.set_title(f"at {n:,} tokens" + (f" ({factor:g}× L)" if factor else ""))
    ax.set_xlabel(f"{what} − {found.baseline}'s {better}")
    return off_scale


def _seeds_of(found: Any, scheme: str, columns: list[int]) -> Any:
    """The interval that tells a scheme's seeds: the first shown one, else any other."""
    shown = [found.by_scheme[scheme][j] for j in columns]
    return next((i for i in shown + found.by_scheme[scheme] if _usable(i)), None)


def difference_blocks(schemes: list[str]) -> list[tuple[str | None, list[str]]]:
    """The rows of a difference figure as (heading, schemes) blocks, `schemes` best first: one
    block without a heading for at most MOST_ROWS schemes; more, a block per family
    (panel_groups) after a block of each family's best (its first)."""
    if len(schemes) <= MOST_ROWS:
        return [(None, schemes)]
    groups = panel_groups(schemes)
    best = sorted((members[0] for members in groups.values()), key=schemes.index)
    return [(BEST_TITLE, best), *groups.items()]


def _difference_places(
    blocks: list[tuple[str | None, list[str]]],
) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """Each block's heading and rows from the top down: ((height, scheme) of every row,
    (height, heading) of every heading)."""
    slots = sum(len(members) + (heading is not None) for heading, members in blocks)
    places: list[tuple[float, str]] = []
    headings: list[tuple[float, str]] = []
    y = slots - 1
    for heading, members in blocks:
        if heading is not None:
            headings.append((y, heading))
            y -= 1
        for scheme in members:
            places.append((y, scheme))
            y -= 1
    return places, headings


def difference_title(found: Any, title: str | None) -> str:
    """What a difference figure draws, after the report's title when that says more."""
    what = "perplexity" if found.metric == "ppl" else "whole-answer accuracy"
    b = found.baseline
    heading = (
        f"difference to {b} in {what} (scheme − {b}): mean and 95% interval over seeds "
        f"({found.mode})"
    )
    return figure_title(heading, title, "difference to")


def difference_figure(found: Any, title: str, styles: dict | None = None) -> Figure | None:
    """Each scheme's difference to the baseline (a `DifferenceSet`) with its 95% interval, one
    row per scheme (so that every scheme is seen, however many there are), at the shortest and
    the longest length with a difference; best at the top, ordered by the longest length (rows
    without it after the others); more than MOST_ROWS schemes in blocks by family after a
    block of each family's best (difference_blocks). Filled: the interval excludes 0; open with
    capped bar: it holds 0 (not distinguishable); open, no bar or cap: a one-seed row (no
    interval); an arrow at a panel's edge: a value (or an interval's end) off its scale.
    Titled by what is drawn (difference_title, `title` the report's). None when no scheme has
    a finite difference."""
    have = [
        j
        for j in range(len(found.lengths))
        if any(_usable(intervals[j]) for intervals in found.by_scheme.values())
    ]
    if not have:
        return None
    columns = sorted({have[0], have[-1]})
    schemes = _ordered_schemes(found, columns)
    styles = styles or {}
    fallback = styles_for(schemes)
    looks = {s: styles.get((s, found.mode)) or fallback[s] for s in schemes}
    places, headings = _difference_places(difference_blocks(schemes))
    slots = len(places) + len(headings)
    fig = new_figure(2.0 + 4.0 * len(columns), 1.4 + 0.3 * slots)
    axes = fig.subplots(1, len(columns), sharey=True, squeeze=False)[0]
    off_scale = False
    for ax, j in zip(axes, columns, strict=True):
        off_scale = _draw_difference_panel(ax, found, j, places, looks) or off_scale
        for y, _ in headings:  # a block's heading: a grey band across the panel
            ax.axhspan(y - 0.5, y + 0.5, color="0.92", lw=0, zorder=0)
        ax.set_ylim(-0.7, slots - 0.3)
    _difference_ticks(axes[0], found, columns, places, headings)
    fig.suptitle(difference_title(found, title))
    return finish_figure(fig, notes=_difference_notes(off_scale, bool(headings)))


def _difference_ticks(
    ax: Axes,
    found: Any,
    columns: list[int],
    places: list[tuple[float, str]],
    headings: list[tuple[float, str]],
) -> None:
    """The row labels, "scheme (3 paired)", and the blocks' headings in bold."""
    ticks = [(y, f"{s} ({pairing_text(_seeds_of(found, s, columns))})") for y, s in places]
    ticks += headings
    ax.set_yticks([y for y, _ in ticks], [text for _, text in ticks])
    bold = {y for y, _ in headings}
    for tick, (y, _) in zip(ax.get_yticklabels(), ticks, strict=True):
        if y in bold:
            tick.set_fontweight("bold")


def _difference_notes(off_scale: bool, blocks: bool) -> list[str | None]:
    return [
        "bar: 95% CI of the difference (paired: over the seeds both rows ran; unpaired: Welch's "
        "from mean ± sd), a cap at each end (one cap through the marker: every seed gave the "
        "same difference). Filled: the interval excludes 0; open with caps: it holds 0 (not "
        "distinguishable); open without caps: one seed, no interval.",
        "rows in blocks by family (poslab/report/families.py); the first block: each family's "
        "best at the longest length, repeated from its own block"
        if blocks
        else None,
        "an arrow at a panel's edge: a difference, or an end of its interval, off the scale; "
        "the values are written beside it."
        if off_scale
        else None,
    ]
