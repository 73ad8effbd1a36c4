"""A report's figures of more than MOST_ROWS rows as small multiples by family
(poslab.report.families): one panel per family, the report's baseline drawn in each for
reference, and a last panel of each family's best; the panels share both axes, and each has
its own legend beside it (every line of a panel named next to it, not in a legend of 29).

Each function returns None for at most MOST_ROWS rows: the caller then draws the one-panel
figure of figures.py (`family_ppl_figure(...) or ppl_figure(...)`, files.report_figures).
The difference figure groups its rows by family itself (figures.difference_blocks).
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from poslab.plotting import (
    LEGEND_FONTSIZE,
    coinciding,
    finish_figure,
    fit_limits,
    hidden_style,
    hidden_text,
    near_span,
    new_figure,
    plain_number,
    sd_band,
    style_for_index,
    wrap,
)
from poslab.report.families import MOST_ROWS, Panel, family_panels
from poslab.report.figures import (
    ACCURACY_TITLE,
    POSITION_TITLE,
    SHORTCUT_NOTE,
    PerplexitySeries,
    band_note,
    draw_accuracy_lines,
    dropped_text,
    figure_title,
    length_panel,
    perplexity_series,
    position_axes,
    position_curves,
    position_line,
    position_notes,
    ppl_yaxis,
    report_styles,
    rows_by_series,
    series_id,
    shortcut_lines,
)
from poslab.report.tables import is_finite

PANEL_COLUMNS = 2
PANEL_WIDTH, PANEL_HEIGHT = 3.9, 2.6  # inches of one panel, its legend beside it
LEGEND_WIDTH = 2.7  # inches kept beside each panel for its legend
LEGEND_CHARS = 36  # a legend entry is wrapped at this many characters

__all__ = ["family_accuracy_figure", "family_position_figure", "family_ppl_figure"]


def family_axes(n: int) -> tuple[Figure, list[Axes]]:
    """A figure of `n` panels in PANEL_COLUMNS columns sharing both axes, room beside each for
    its legend; a panel above an empty slot keeps its x tick labels."""
    rows = math.ceil(n / PANEL_COLUMNS)
    fig = new_figure(PANEL_COLUMNS * (PANEL_WIDTH + LEGEND_WIDTH), rows * PANEL_HEIGHT + 0.9)
    grid = fig.subplots(rows, PANEL_COLUMNS, sharex=True, sharey=True, squeeze=False)
    flat = list(grid.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    for k, ax in enumerate(flat[:n]):
        if k + PANEL_COLUMNS >= n:  # nothing drawn below it: its x ticks are the column's
            ax.xaxis.set_tick_params(which="both", labelbottom=True)
    return fig, flat[:n]


def label_panels(axes: list[Axes], ylabel: str, xlabel: str) -> None:
    """Axis labels once per row (y, left column) and per column (x, its lowest panel)."""
    for k, ax in enumerate(axes):
        ax.set_ylabel(ylabel if k % PANEL_COLUMNS == 0 else "")
        ax.set_xlabel(xlabel if k + PANEL_COLUMNS >= len(axes) else "")


def panel_legend(ax: Axes, handles: list) -> None:
    """The panel's own legend, beside it, its entries wrapped to LEGEND_CHARS."""
    labels = [wrap(h.get_label(), LEGEND_CHARS) for h in handles]
    ax.legend(
        handles,
        labels,
        fontsize=LEGEND_FONTSIZE - 1,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        frameon=False,
    )


def panel_label(panel: Panel, label: str, hidden: dict) -> str:
    """A line's legend text on its panel, naming the line that hides it there."""
    name = panel.names[label]
    return f"{name} ({hidden_text(hidden[label])})" if label in hidden else name


def family_note(baseline: str | None, best: str) -> str:
    """What the panels of a figure by family are."""
    reference = f"; {baseline} (the baseline) drawn in every panel" if baseline else ""
    return (
        f"more than {MOST_ROWS} rows: one panel per family of schemes "
        f"(poslab/report/families.py), all panels on the same axes{reference}; the last panel: "
        f"each family's {best}"
    )


def _baselines(ids: dict[str, tuple], baseline: str | None) -> list[str]:
    return [label for label, key in ids.items() if baseline is not None and key[0] == baseline]


# A series whose lowest perplexity lies further above every other series than those span
# themselves (in log10) goes off the top of the shared scale: two sinusoidal rows at 320-520
# would squeeze 27 others at 125-165 into a sixth of every panel. At most a quarter of the
# series can; each is named with its range in its panel's legend and marked at the top edge.
OFF_SCALE_GAP = 1.0


def above_scale(series: dict[str, list[tuple[int, float]]]) -> list[str]:
    """The series drawn above the shared scale (OFF_SCALE_GAP), highest last; [] for none."""
    ranked = sorted(series, key=lambda label: min(y for _, y in series[label]))
    for k in range(max(2, math.ceil(0.75 * len(ranked))), len(ranked)):
        bulk = [math.log10(y) for label in ranked[:k] for _, y in series[label]]
        lowest = math.log10(min(y for _, y in series[ranked[k]]))
        span = max(bulk) - min(bulk)
        if span > 0 and lowest - max(bulk) > OFF_SCALE_GAP * span:
            return ranked[k:]
    return []


def range_text(pts: list[tuple[int, float]]) -> str:
    low, high = min(y for _, y in pts), max(y for _, y in pts)
    return f"{plain_number(low)}–{plain_number(high)}"


def _draw_ppl_panel(
    ax: Axes,
    panel: Panel,
    found: PerplexitySeries,
    looks: dict[str, dict],
    above: list[str],
    log: bool,
) -> tuple[list, list[float]]:
    """One family's perplexity lines with their ± sd bands; a series above the scale marked at
    the panel's top edge and its range written in the legend. Returns the legend's handles
    and the bands' edges."""
    drawn = {x: found.points[x] for x in panel.labels}
    kept = [y for x, pts in drawn.items() if x not in above for _, y in pts]
    hidden = coinciding(drawn, near_span(kept, log), log, relative=True)
    handles, edges = [], []
    for label, pts in drawn.items():
        style = hidden_style(looks[label]) if label in hidden else looks[label]
        text = panel_label(panel, label, hidden)
        if label in above:  # off the top: the line leaves the panel; marks at its edge
            text += f" (above the scale: {range_text(pts)})"
            xs = [x for x, _ in pts]
            top = ax.get_xaxis_transform()  # x in data, y in axes units
            ax.plot(
                xs,
                [0.985] * len(xs),
                transform=top,
                marker="^",
                ls="none",
                ms=6,
                color=style["color"],
                clip_on=False,
            )
        handles += ax.plot(*zip(*pts, strict=True), label=text, **style)
        spread = found.spread.get(label, {})
        band = [(n, p, spread[n][0]) for n, p in pts if n in spread]
        if label not in above:
            edges += sd_band(ax, band, looks[label]["color"], "positive")
    return handles, edges


def family_ppl_figure(
    rows: list[dict],
    series_key: str,
    title: str,
    styles: dict | None = None,
    baseline: str | None = None,
) -> Figure | None:
    """Perplexity against evaluation length by family (see the module docstring), with each
    series' ± sd band over seeds and a series far above all others off the scale
    (above_scale); None for at most MOST_ROWS series."""
    found = perplexity_series(rows, series_key)
    series = found.points
    if len(series) <= MOST_ROWS:
        return None
    styles = styles or report_styles(rows, series_key)
    looks = {x: styles.get(found.ids[x]) or style_for_index(i) for i, x in enumerate(series)}
    panels = family_panels(series, _baselines(found.ids, baseline), lower_is_better=True)
    fig, axes = family_axes(len(panels))
    above = above_scale(series)
    values = [ppl for x, pts in series.items() if x not in above for _, ppl in pts]
    log = ppl_yaxis(axes[0], values) == "log"  # the axes share their y ticker and limits
    edges: list[float] = []
    for ax, panel in zip(axes, panels, strict=True):
        handles, panel_edges = _draw_ppl_panel(ax, panel, found, looks, above, log)
        edges += panel_edges
        length_panel(ax, {r["train_length"] for r in rows})
        ax.set_title(panel.title)
        panel_legend(ax, handles)
    cut = fit_limits(axes[0], values, edges, log)
    label_panels(axes, "perplexity", "evaluation length (tokens); dotted: training length")
    what = figure_title("perplexity vs evaluation length", title, "perplexity")
    fig.suptitle(f"{what}, by family")
    notes = [
        family_note(baseline, "lowest perplexity at the longest length"),
        off_scale_note(above, series),
        band_note(found.spread, cut),
        dropped_text(found.dropped),
    ]
    return finish_figure(fig, notes=notes)


def off_scale_note(above: list[str], series: dict[str, list[tuple[int, float]]]) -> str | None:
    if not above:
        return None
    named = "; ".join(f"{x} {range_text(series[x])}" for x in above)
    return (
        f"above the shared scale (▲ at the top edge; far above every other row, they would "
        f"squeeze the rest into a strip): {named}"
    )


def family_position_figure(
    rows: list[dict],
    title: str,
    styles: dict | None = None,
    series_key: str = "scheme",
    baseline: str | None = None,
) -> Figure | None:
    """The smoothed loss by position (figures.position_curves) by family, a ± sd band over
    seeds where a row keeps its seeds' buckets; None for at most MOST_ROWS lines."""
    found = position_curves(rows, series_key)
    curves = found.curves
    if len(curves) <= MOST_ROWS:
        return None
    styles = styles or report_styles(rows, series_key)
    looks = {x: styles.get(found.keys[x]) or style_for_index(i) for i, x in enumerate(curves)}
    # best: the lowest loss over the window at the longest length a row reaches
    ranking = {x: [(found.rows[x]["length"], found.rows[x]["loss"])] for x in curves}
    panels = family_panels(ranking, _baselines(found.keys, baseline), lower_is_better=True)
    fig, axes = family_axes(len(panels))
    losses = [y for pts in curves.values() for _, y in pts]
    for ax, panel in zip(axes, panels, strict=True):
        drawn = {x: curves[x] for x in panel.labels}
        hidden = coinciding(drawn, near_span(losses, False), relative=True)
        handles = []
        for label, pts in drawn.items():
            text = panel_label(panel, label, hidden)
            handles.append(position_line(ax, pts, looks[label], text, label in hidden))
            sd_band(ax, found.bands.get(label, []), looks[label]["color"])
        position_axes(ax, rows, labels=False)
        ax.set_title(panel.title)
        panel_legend(ax, handles)
    label_panels(axes, "mean loss (nats)", "position in window (+1); dotted: training length")
    fig.suptitle(f"{figure_title(POSITION_TITLE, title, 'loss by position')}, by family")
    notes = [family_note(baseline, "lowest loss at the longest length"), *position_notes(found)]
    return finish_figure(fig, notes=notes)


def family_accuracy_figure(
    rows: list[dict],
    series_key: str,
    title: str,
    styles: dict | None = None,
    baseline: str | None = None,
) -> Figure | None:
    """Whole-answer accuracy against evaluation length by family, with the best shortcut the
    rows state in every panel and a ± sd band (clipped to [0, 1]) over seeds; None for at most
    MOST_ROWS series. The answer-token accuracy (the one-panel figure's right panel) is left to
    the table: a second grid of panels would double a figure that is already large."""
    grouped = rows_by_series(
        rows, series_key, lambda r: r["status"] == "ok" and is_finite(r.get("accuracy"))
    )
    if len(grouped) <= MOST_ROWS:
        return None
    styles = styles or report_styles(rows, series_key)
    series = {x: sorted(pts, key=lambda r: r["length"]) for x, pts in grouped.items()}
    points = {x: [(r["length"], r["accuracy"]) for r in pts] for x, pts in series.items()}
    ids = {x: series_id(pts[0], series_key) for x, pts in series.items()}
    panels = family_panels(points, _baselines(ids, baseline), lower_is_better=False)
    fig, axes = family_axes(len(panels))
    several_tasks = len({r["mode"] for r in rows}) > 1
    for ax, panel in zip(axes, panels, strict=True):
        drawn = {x: series[x] for x in panel.labels}
        handles, _, _ = draw_accuracy_lines([ax], drawn, ("accuracy",), series_key, styles)
        for line, label in zip(handles, drawn, strict=True):  # the panel's names
            line.set_label(line.get_label().replace(label, panel.names[label], 1))
        length_panel(ax, {r["train_length"] for r in rows})
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(panel.title)
        references = shortcut_lines([(ax, "shortcut")], rows, several_tasks)
        panel_legend(ax, handles + references)
    label_panels(
        axes, "accuracy (whole answer right)", "evaluation length (tokens); dotted: training length"
    )
    fig.suptitle(f"{figure_title(ACCURACY_TITLE, title, 'accuracy')}, by family")
    merged = any(r.get("n_seeds", 1) > 1 for pts in series.values() for r in pts)
    notes = [
        family_note(baseline, "highest accuracy at the longest length"),
        "shaded: ± 1 sd over seeds, clipped to [0, 1]" if merged else None,
        "the answer-token accuracy of each row: the report's table and CSV",
        SHORTCUT_NOTE if any(is_finite(r.get("shortcut")) for r in rows) else None,
    ]
    return finish_figure(fig, notes=notes)
