"""What keeps a figure readable, for every figure poslab draws (evaluation reports, analysis
plots, a learnable θ after training): tests/evaluation/test_figures_readable.py checks each on
the drawn figure.

* one line style per series, unique for any number of series (`style_for_index`: colour ×
  marker × dash), given by the series' place in a naturally sorted list (`styles_for`), so that
  one series looks the same in each figure that is given the same list;
* series whose plotted values are equal everywhere (one line hidden under the other) are found
  (`coinciding`) and named ("mrope (= rope, coincide)"), drawn beneath with larger hollow markers;
* ± sd bands stay inside what the value can be (`band_limits`): [0, 1] for accuracies, > 0 for
  perplexities and their ratios;
* a log axis is labelled inside the range of its data (`NiceLogLocator`);
* the legend goes beside the panels when it is narrow and below them when it is not, titles
  are wrapped to their width, and the canvas grows until every text is on it (`finish_figure`);
* legends are in natural order (numbers compared as numbers: 100 < 1000 < 10000.0 < 100000).

A floor below the schemes (scripts/imports.py): the rotary scheme draws its θ plot with it.
matplotlib (Agg: files only) is imported here; import this module only where a figure is drawn.
"""

from __future__ import annotations

import bisect
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# values equal within this relative difference at every point are one line on the figure
COINCIDE_RTOL = 1e-9
NOTE_FONTSIZE = 7
LEGEND_FONTSIZE = 8


def is_number(value: object) -> bool:
    """A real, finite number (not None, NaN or ±inf)."""
    return isinstance(value, int | float) and math.isfinite(value)


def natural_key(text: str) -> tuple:
    """Sort key comparing the numbers in `text` as numbers: "base=100" < "base=1000" <
    "base=10000.0" < "base=100000" (a string sort puts "10000.0" after "100000")."""
    parts = re.split(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", str(text))
    return tuple(
        (1, float(part), part) if i % 2 else (0, part.lower(), part)
        for i, part in enumerate(parts)
        if part
    )


def natural_sorted(items: Iterable[Any], key: Any = None) -> list:
    """`items` in natural order (see natural_key); `key` maps an item to its text (or a tuple of
    texts)."""

    def sort_key(item: Any) -> tuple:
        value = item if key is None else key(item)
        if isinstance(value, tuple):
            return tuple(natural_key(v) for v in value)
        return natural_key(value)

    return sorted(items, key=sort_key)


# ---------------------------------------------------------------- styles

COLOURS = tuple(matplotlib.colormaps["tab10"].colors)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", "*")  # 9: coprime with the 10 colours
DASHES = ("-", "--", ":", "-.")


def dash(j: int) -> Any:
    """The dash of the j-th block of ten series: the four named ones for j < 36, then a dash
    pattern of its own for every j (never one of the named ones)."""
    return DASHES[j % 4] if j < 36 else (0, (4 + (j - 36) * 0.5, 1.5))


def style_for_index(i: int) -> dict:
    """The i-th series style: colour i mod 10, marker i mod 9, dash by i // 10. Unique for every
    i: (i mod 10, i mod 9) repeats only every 90 series, and series 90·m apart (m = 1, 2, 3) get
    dashes m apart mod 4; from 360 on the dash is a pattern of its own."""
    return {"color": COLOURS[i % 10], "marker": MARKERS[i % 9], "ls": dash(i // 10)}


def styles_for(keys: Iterable[Any]) -> dict[Any, dict]:
    """One style per distinct key, by its index in the naturally sorted keys."""
    ordered = natural_sorted(dict.fromkeys(keys))
    return {k: style_for_index(i) for i, k in enumerate(ordered)}


# ---------------------------------------------------------------- coinciding series


class Hidden(NamedTuple):
    """A series drawn beneath an equal (or, to the eye, equal) one."""

    by: str  # the series drawn last of its group, on top
    gap: float  # 0.0: equal (COINCIDE_RTOL); else the largest difference, relative if `relative`
    relative: bool


def coinciding(
    series: dict[str, Sequence[tuple[float, float]]],
    near: float = 0.0,
    log: bool = False,
    relative: bool | None = None,
) -> dict[str, Hidden]:
    """Series whose points are those of another: the same x and y equal within COINCIDE_RTOL,
    or, with `near` > 0, y within `near` axis units (in log10 when `log`: an axis of about
    300 pixels shows 0.004 of its span as about one pixel, so such lines hide each other too).
    Each maps to the series drawn last of its group (keys in drawing order), which hides it,
    with their largest difference, relative (of positive values) when `relative` (default:
    `log`), else absolute."""
    relative = log if relative is None else relative
    labels = list(series)
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    for i, a in enumerate(labels):
        if a in group_of:
            continue
        group_of[a] = len(groups)
        groups.append([a])
        for b in labels[i + 1 :]:
            if b not in group_of and points_gap(series[a], series[b], near, log) is not None:
                group_of[b] = group_of[a]
                groups[-1].append(b)
    hidden = {}
    for g in groups:
        for label in g[:-1]:
            gap = points_gap(series[label], series[g[-1]], math.inf, relative)
            exact = same_points(series[label], series[g[-1]])
            hidden[label] = Hidden(g[-1], 0.0 if exact else gap or 0.0, relative)
    return hidden


def points_gap(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]], near: float, log: bool
) -> float | None:
    """None unless `a` and `b` have the same x and y within `near` axis units (or equal); else
    their largest difference: relative (|a − b| / max, and `near` in log10 units) when `log`,
    else absolute."""
    if len(a) != len(b) or not a:
        return None
    if same_points(a, b):
        return 0.0
    worst = 0.0
    for (xa, ya), (xb, yb) in zip(sorted(a), sorted(b), strict=True):
        if xa != xb:
            return None
        if log:
            if ya <= 0 or yb <= 0 or abs(math.log10(ya / yb)) > near:
                return None
            worst = max(worst, abs(ya - yb) / max(ya, yb))
        else:
            if abs(ya - yb) > near:
                return None
            worst = max(worst, abs(ya - yb))
    return worst


def same_points(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    if len(a) != len(b) or not a:
        return False
    for (xa, ya), (xb, yb) in zip(sorted(a), sorted(b), strict=True):
        if xa != xb or abs(ya - yb) > COINCIDE_RTOL * max(abs(ya), abs(yb)):
            return False
    return True


def near_span(values: Iterable[float], log: bool, fraction: float = 0.004) -> float:
    """`fraction` of the span of `values` in axis units (log10 units when `log`): the `near` of
    `coinciding` for an axis showing them."""
    finite = [v for v in values if is_number(v) and (v > 0 or not log)]
    if len(finite) < 2:
        return 0.0
    if log:
        finite = [math.log10(v) for v in finite]
    return fraction * (max(finite) - min(finite))


def hidden_text(hidden: Hidden) -> str:
    if hidden.gap == 0.0:
        return f"= {hidden.by}, coincide"
    gap = f"{100 * hidden.gap:.2g}%" if hidden.relative else f"{hidden.gap:.2g}"
    return f"≈ {hidden.by}, within {gap}"


def coincide_label(label: str, hidden: dict[str, Hidden]) -> str:
    """The legend label of a series, naming the one that hides it: "mrope (= rope, coincide)",
    "rope + dynamic_ntk (≈ rope + ntk s=auto, within 0.0098%)"."""
    return f"{label} ({hidden_text(hidden[label])})" if label in hidden else label


def coincide_note(panel: str, hidden: dict[str, Hidden]) -> str | None:
    """A footnote for coincidences the legend does not name (those of another panel)."""
    if not hidden:
        return None
    pairs = "; ".join(f"{a} ({hidden_text(h)})" for a, h in hidden.items())
    return f"{panel}, lines drawn on top of each other: {pairs}"


def sparse_marks(xs: Sequence[float], count: int = 12, log: bool = False) -> list[int]:
    """Indices of about `count` points spread evenly along x (in log x when `log`): where a
    dense or noisy line shows its markers (matplotlib's fractional markevery follows the drawn
    path, so a noisy stretch would get them all)."""
    xs = [float(x) for x in xs]
    if len(xs) <= count:
        return list(range(len(xs)))
    if log:
        xs = [math.log(x) if x > 0 else -math.inf for x in xs]
    finite = [x for x in xs if math.isfinite(x)]
    lo, hi = min(finite), max(finite)
    targets = [lo + (hi - lo) * k / (count - 1) for k in range(count)]
    return sorted({min(range(len(xs)), key=lambda i: abs(xs[i] - t)) for t in targets})


def hidden_style(style: dict) -> dict:
    """A line drawn beneath an equal one: larger hollow markers that show around the top one."""
    return {**style, "markersize": 10, "markerfacecolor": "none", "markeredgewidth": 1.4}


# ---------------------------------------------------------------- axes


def plain_number(value: float) -> str:
    """A tick label without offset or scientific notation: 20, 1,000, 13,300, 0.5."""
    if value >= 10:
        return f"{value:,.0f}" if abs(value - round(value)) < 1e-6 * value else f"{value:,.1f}"
    return f"{value:.3g}"


# mantissas of the ticks a log axis may get, most preferred first (10^k, then 2 and 5, ...)
LOG_TICK_RANKS = (
    (1.0,),
    (2.0, 5.0),
    (3.0,),
    (1.5, 4.0, 6.0, 8.0),
    (2.5, 7.0, 9.0),
    (1.2, 1.4, 1.6, 1.8, 3.5, 4.5),
    tuple(round(1.1 + 0.1 * k, 1) for k in range(89)),
)


class NiceLogLocator(matplotlib.ticker.Locator):
    """Ticks of a log axis, each labelled, inside the axis' view: powers of ten first, then 2×
    and 5×, then finer mantissas (3, 1.5, 4, ...), each added only where it leaves room for its
    label (2 label heights from every other tick), at most about one per 3 label heights of
    axis. Unlike LogLocator with labelled minor ticks, a cluster of values (125-165 beside one
    line at 2,000) still gets a tick near it when there is room (within a rank, the ticks
    nearest to the plotted `data` come first), and a range within a decade gets several
    labelled ticks."""

    def __init__(self, data: Iterable[float] = ()):
        # the values plotted: within a rank, ticks nearest to them come first
        self.data = sorted(math.log10(v) for v in data if is_number(v) and v > 0)

    def __call__(self) -> list[float]:
        lo, hi = self.axis.get_view_interval()
        return self.tick_values(lo, hi)

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        lo, hi = sorted((vmin, vmax))
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= 0:
            return []
        lo = lo if lo > 0 else hi * 1e-3
        decades = math.log10(hi / lo) if hi > lo else 1.0
        axis_px, label_px = self.axis_pixels()
        if axis_px and label_px:
            min_gap = 2.0 * label_px / axis_px * decades  # in decades
            most = max(3, int(axis_px / (3.0 * label_px)))
        else:
            min_gap, most = decades / 8, 8
        chosen: list[float] = []
        for mantissas in LOG_TICK_RANKS:
            exponents = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
            values = [float(f"{m * 10.0**e:.6g}") for e in exponents for m in mantissas]
            for value in sorted((v for v in values if lo <= v <= hi), key=self.to_data):
                if len(chosen) >= most:
                    break
                gap = min((abs(math.log10(value / t)) for t in chosen), default=math.inf)
                if gap >= min_gap:
                    chosen.append(value)
        return sorted(chosen)

    def to_data(self, value: float) -> float:
        """How far (decades) `value` is from the nearest plotted value (0 without data)."""
        if not self.data:
            return 0.0
        x = math.log10(value)
        i = bisect.bisect_left(self.data, x)
        return min(abs(x - self.data[j]) for j in (i - 1, i) if 0 <= j < len(self.data))

    def axis_pixels(self) -> tuple[float | None, float | None]:
        """The axis' length and a tick label's height, in pixels (None before it has a figure)."""
        axis = getattr(self, "axis", None)
        axes = getattr(axis, "axes", None)
        if axes is None or axes.figure is None:
            return None, None
        vertical = axis.axis_name == "y"
        box = axes.bbox
        length = box.height if vertical else box.width
        size = FontProperties(
            size=matplotlib.rcParams["ytick.labelsize" if vertical else "xtick.labelsize"]
        ).get_size_in_points()
        label = size * axes.figure.dpi / 72 * (1.0 if vertical else 3.0)  # width ~ 3 heights
        return (length if length > 1 else None), label


# ---------------------------------------------------------------- bands


def band_limits(
    mean: float, sd: float, bounds: str | None
) -> tuple[float, float] | tuple[None, None]:
    """mean ± sd kept inside what the value can be. "unit" (an accuracy): clipped to [0, 1].
    "positive" (a perplexity, a ratio of two): mean + sd above, mean ÷ (1 + sd/mean) below (the
    upper distance mirrored on a log scale; ≈ mean − sd when sd ≪ mean), so it never reaches 0."""
    if not (is_number(mean) and is_number(sd)):
        return None, None
    sd = abs(sd)
    if bounds == "positive":
        if mean <= 0:
            return None, None
        return mean / (1 + sd / mean), mean + sd
    low, high = mean - sd, mean + sd
    if bounds == "unit":
        low, high = min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0)
    return low, high


def sd_band(
    ax: Axes, points: list[tuple[float, float, float]], color: Any, bounds: str | None = None
) -> list[float]:
    """A shaded band of ± one sd around (x, mean, sd) points (rows merged over seeds), kept in
    `bounds` (see band_limits); returns its lower and upper edges (for `fit_limits`)."""
    kept = [(x, *band_limits(m, s, bounds)) for x, m, s in points]
    kept = [p for p in kept if p[1] is not None]
    if not kept:
        return []
    xs, lows, highs = zip(*kept, strict=True)
    ax.fill_between(xs, lows, highs, color=color, alpha=0.15, lw=0)
    return [*lows, *highs]


def fit_limits(
    ax: Axes, lines: Iterable[float], bands: Iterable[float], log: bool, room: float = 0.25
) -> bool:
    """y-limits that show every line and the bands up to `room` × the lines' span beyond them
    (in log10 units on a log axis), plus a 5% margin: a band wider than that (sd above the mean)
    is cut at the panel's edge rather than squeezing the lines into a few pixels, where no tick
    would label them. True when a band was cut (the caller says so). Fewer than two distinct
    line values: the limits are left to matplotlib (and ppl_yaxis)."""
    ok = [v for v in lines if is_number(v) and (v > 0 or not log)]
    if len(set(ok)) < 2:
        return False
    f = math.log10 if log else float
    lo, hi = min(map(f, ok)), max(map(f, ok))
    edges = [f(v) for v in bands if is_number(v) and (v > 0 or not log)]
    span = hi - lo
    low = max(min([lo, *edges]), lo - room * span)
    high = min(max([hi, *edges]), hi + room * span)
    margin = 0.05 * (high - low)
    ax.set_ylim(
        *((10 ** (low - margin), 10 ** (high + margin)) if log else (low - margin, high + margin))
    )
    return any(e < lo - room * span or e > hi + room * span for e in edges)


# ---------------------------------------------------------------- layout


def new_figure(width: float, height: float, **kw: Any) -> Figure:
    """A figure with constrained layout: tick labels, axis labels and titles get their room."""
    return plt.figure(figsize=(width, height), layout="constrained", **kw)


def wrap(text: str, chars: int) -> str:
    """`text` wrapped at `chars` characters per line (its own line breaks kept)."""
    chars = max(12, int(chars))
    return "\n".join(
        textwrap.fill(line, chars, break_long_words=False, break_on_hyphens=False) or line
        for line in text.split("\n")
    )


def fit_text_width(text: Any, width_px: float, renderer: Any) -> None:
    """Wrap a Text artist until it is at most `width_px` wide (it keeps its words whole, and
    its line breaks: a title's "report title\nwhat is drawn", one footnote per line)."""
    content = text.get_text()
    if not content:
        return
    for _ in range(6):
        box = text.get_window_extent(renderer)
        if box.width <= width_px or "\n" not in content and " " not in content:
            return
        longest = max(len(line) for line in content.split("\n"))
        chars = int(longest * width_px / box.width * 0.97)
        new = wrap(content, chars)  # each line on its own: the breaks say something
        if new == content:
            return
        content = new
        text.set_text(content)


def text_artists(fig: Figure) -> list[Any]:
    """Every text the figure draws, as artists with a window extent: titles, axis labels, the
    tick labels in view, texts on axes and on the figure (notes, suptitle), legends."""
    found: list[Any] = []
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        if ax.axison:
            found += [ax.xaxis.label, ax.yaxis.label]
            found += [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
            for axis in (ax.xaxis, ax.yaxis):  # the ticks drawn (in view), not every tick made
                found += [t for tick in axis._update_ticks() for t in (tick.label1, tick.label2)]
        if ax.get_legend() is not None:
            found.append(ax.get_legend())
    found += [*fig.texts, *fig.legends]
    return [
        a for a in found if a.get_visible() and (not hasattr(a, "get_text") or a.get_text().strip())
    ]


def finish_figure(
    fig: Figure,
    handles: Sequence[Any] = (),
    labels: Sequence[str] = (),
    notes: Sequence[str | None] = (),
    where: str = "auto",
) -> Figure:
    """Lay out a figure made by `new_figure` so that nothing is cut off: the legend (`handles`,
    `labels`) beside the panels when it is at most 25% of the width and fits their height, else
    below them in as many columns as the width holds; the notes (footnotes) under everything;
    the canvas grows to hold both, so the panels keep their size. Titles are wrapped to their
    axes' width (the suptitle to the figure's). A last check grows the canvas until every text
    is on it (`fit_canvas`)."""
    width, height = fig.get_size_inches()
    dpi = fig.dpi
    renderer = fig.canvas.get_renderer()
    notes = [n for n in notes if n]
    legend = None
    side = "none"
    if labels:
        legend = fig.legend(handles, labels, fontsize=LEGEND_FONTSIZE, loc="upper left")
        box = legend.get_window_extent(renderer)
        fits_beside = box.width / dpi <= 0.25 * width and box.height / dpi <= height - 0.2
        side = "right" if where == "right" or (where == "auto" and fits_beside) else "bottom"
        if side == "bottom":
            columns = max(1, min(len(labels), int((width - 0.3) * dpi // box.width)))
            legend.remove()
            legend = fig.legend(
                handles, labels, fontsize=LEGEND_FONTSIZE, loc="lower center", ncol=columns
            )
            box = legend.get_window_extent(renderer)
        legend_w, legend_h = box.width / dpi, box.height / dpi
    note = None
    if notes:
        chars = width * 72 / (NOTE_FONTSIZE * 0.55)
        note = fig.text(
            0.005,
            0.005,
            "\n".join(wrap(n, chars) for n in notes),
            fontsize=NOTE_FONTSIZE,
            color="dimgray",
            ha="left",
            va="bottom",
        )
        fit_text_width(note, (width - 0.1) * dpi, renderer)
    note_h = note.get_window_extent(renderer).height / dpi + 0.08 if note else 0.0
    right_w = legend_w + 0.15 if side == "right" else 0.0
    bottom_h = note_h + (legend_h + 0.1 if side == "bottom" else 0.0)
    fig.poslab_layout = {"right": right_w, "bottom": bottom_h, "note": note_h, "side": side}
    fig.set_size_inches(width, height + bottom_h)
    place(fig, legend)
    fit_canvas(fig, title_width=width - right_w)
    return fig


def place(fig: Figure, legend: Any) -> None:
    """The layout rectangle of the panels and the legend's anchor, for the figure's current size
    and its `poslab_layout` (inches kept for the legend and notes); the suptitle is centred over
    the panels, not over the legend beside them."""
    layout = fig.poslab_layout
    width, height = fig.get_size_inches()
    right, bottom = layout["right"] / width, layout["bottom"] / height
    fig.get_layout_engine().set(rect=(0, bottom, 1 - right, 1 - bottom))
    if fig._suptitle is not None:
        fig._suptitle.set_x((1 - right) / 2)
    if legend is None:
        return
    if layout["side"] == "right":
        legend.set_bbox_to_anchor((1 - right + 0.05 / width, 1 - 0.05 / height), fig.transFigure)
    else:
        legend.set_bbox_to_anchor((0.5, (layout["note"] + 0.02) / height), fig.transFigure)


def wrap_titles(fig: Figure, width: float) -> bool:
    """Axes titles wrapped to their axes' width, the suptitle to `width` inches (of a drawn
    figure); True when one was."""
    renderer = fig.canvas.get_renderer()
    titles = [(t, ax.bbox.width * 1.02) for ax in fig.axes for t in (ax.title, ax._left_title)]
    titles += [(t, ax.bbox.width * 1.02) for ax in fig.axes for t in (ax._right_title,)]
    if fig._suptitle is not None:
        titles.append((fig._suptitle, (width - 0.4) * fig.dpi))
    changed = False
    for title, room in titles:
        before = title.get_text()
        fit_text_width(title, room, renderer)
        changed = changed or title.get_text() != before
    return changed


def overflow(fig: Figure) -> tuple[float, float, float, float]:
    """How far (inches: left, bottom, right, top) the figure's texts reach past its canvas."""
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    out = [0.0, 0.0, 0.0, 0.0]
    for artist in text_artists(fig):
        box = artist.get_window_extent(renderer)
        out = [
            max(out[0], -box.x0),
            max(out[1], -box.y0),
            max(out[2], box.x1 - width),
            max(out[3], box.y1 - height),
        ]
    return tuple(v / fig.dpi for v in out)


def fit_canvas(fig: Figure, tries: int = 4, title_width: float | None = None) -> None:
    """Draw the figure and grow its canvas until every text lies on it (the bbox_inches="tight"
    of savefig, but in the figure itself: what is drawn is what is saved); with `title_width`
    (inches), titles too wide for their place are wrapped first (`wrap_titles`)."""
    for _ in range(tries):
        fig.canvas.draw()
        if title_width is not None and wrap_titles(fig, title_width):
            fig.canvas.draw()
        left, bottom, right, top = overflow(fig)
        if max(left, bottom, right, top) <= 0.5 / fig.dpi:
            break
        width, height = fig.get_size_inches()
        layout = getattr(fig, "poslab_layout", None)
        fig.set_size_inches(width + left + right + 0.1, height + bottom + top + 0.1)
        if layout is not None:
            legend = fig.legends[0] if fig.legends else None
            if bottom > 0:  # the notes or the legend below: the space under the panels grows
                layout["bottom"] += bottom + 0.05
                layout["note"] += bottom + 0.05 if layout["side"] != "bottom" else 0.0
            if right > 0 and layout["side"] == "right":
                layout["right"] += right + 0.05
            place(fig, legend)
    else:
        fig.canvas.draw()
    # The layout is final and drawn: freeze it, so that savefig (and W&B's copy) draw these
    # positions instead of running the constrained layout again (a third of a figure's time).
    fig.set_layout_engine("none")


# ---------------------------------------------------------------- for checks and old callers


def line_styles(n: int) -> list[dict]:
    """n distinct line styles (style_for_index 0..n−1)."""
    return [style_for_index(i) for i in range(n)]


def series_lines(fig: Figure) -> list[Line2D]:
    """The lines of the figure that are data series (labelled, not reference lines)."""
    return [
        line
        for ax in fig.axes
        for line in ax.get_lines()
        if not line.get_label().startswith("_") and line.get_marker() not in (None, "None", "")
    ]
