"""Extrapolation results as files: JSON (everything), CSV, a Markdown table, PNG plots.

Row statuses: "ok"; "skipped: <reason>" (a length the scheme cannot represent: a "—" cell, no
point); "nonfinite" (the model diverged: loss/ppl are NaN or inf: a "nonfinite" cell, no point).
A row of an older file that says "ok" but holds a non-finite value is treated as "nonfinite".

The files of one evaluation are written all or none (`write_all_or_none`): a full disk or a kill
leaves the previous set complete, never a truncated JSON beside an older table.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from poslab.errors import NO_SPACE_ERRNOS, ConfigError  # noqa: E402

CSV_FIELDS = [
    "scheme", "train_length", "mode", "split", "length", "factor", "status", "tokens", "loss",
    "ppl", "word_ppl", "bits_per_byte", "tokens_per_s", "seconds", "vocab_size",
    # rows merged over seeds (poslab.evaluation.seeds): the spread and the seeds
    "loss_sd", "ppl_sd", "word_ppl_sd", "bits_per_byte_sd", "ratio", "ratio_sd", "n_seeds", "seeds",
    # generated tasks (poslab.evaluation.tasks): answer accuracy, and a uniform guess's
    "task", "accuracy", "accuracy_sd", "token_accuracy", "token_accuracy_sd", "chance",
    "token_chance", "examples",
]  # fmt: skip
NONFINITE = "nonfinite"  # the cell of a diverged model (NaN or inf), never "—" (a skipped length)
# a log y-axis when the largest perplexity is at least this many times the smallest (see
# ppl_yaxis for why)
LOG_AXIS_MIN_RATIO = 3.0


def is_finite(value: object) -> bool:
    """A real, finite number (not None, NaN or ±inf)."""
    return isinstance(value, int | float) and math.isfinite(value)


def is_nonfinite(row: dict, value: str = "ppl") -> bool:
    """A row of a diverged model: status "nonfinite", or (older files) "ok" with a NaN/inf
    loss or `value`."""
    if row.get("status") == NONFINITE:
        return True
    return row.get("status") == "ok" and any(
        isinstance(row.get(k), float) and not math.isfinite(row[k]) for k in ("loss", value)
    )


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:,.{digits}f}" if value < 1e5 else f"{value:.3g}"


def cell(row: dict | None, value: str) -> str:
    """One Markdown cell: "—" for a length not evaluated or skipped, "nonfinite" for a diverged
    model, else the number."""
    if row is None or str(row.get("status", "")).startswith("skipped"):
        return "—"
    if is_nonfinite(row, value):
        return NONFINITE
    if row.get("status") != "ok":
        return str(row.get("status"))
    if row.get("n_seeds", 1) > 1 and is_finite(row.get(f"{value}_sd")):
        return f"{fmt(row.get(value))} ± {fmt(row[f'{value}_sd'])}"
    return fmt(row.get(value))


def seeds_note(rows: list[dict]) -> str:
    """How many seeds the rows' cells stand for: "mean ± sample sd over 3 seeds" or "one seed
    per row (no spread)"."""
    counts = sorted({r.get("n_seeds", 1) for r in rows})
    if counts == [1]:
        return "One seed per row (no spread)."
    merged = {r["scheme"] for r in rows if r.get("n_seeds", 1) > 1}
    n = "/".join(str(c) for c in counts if c > 1)
    if len(merged) < len({r["scheme"] for r in rows}):
        return (
            f"Rows merged over seeds ({', '.join(sorted(merged))}) show mean ± sample sd over "
            f"{n} seeds; the other rows are one seed."
        )
    return f"Cells are mean ± sample sd over {n} seeds."


def metric_name(rows: list[dict]) -> str:
    """The tokenizer-independent metric of these rows: word_ppl or bits_per_byte."""
    return (
        "word_ppl"
        if all(r.get("word_level") for r in rows if r["status"] in ("ok", NONFINITE))
        else "bits_per_byte"
    )


def markdown_table(rows: list[dict], value: str = "ppl", row_key: str = "scheme") -> str:
    """Rows = `row_key` values (schemes, or modes), columns = eval lengths, cells = `value`."""
    lengths = sorted({r["length"] for r in rows})
    keys = list(dict.fromkeys(r[row_key] for r in rows))
    cells = {(r[row_key], r["length"]): r for r in rows}
    head = f"| {row_key} | " + " | ".join(str(n) for n in lengths) + " |"
    lines = [head, "|---" * (len(lengths) + 1) + "|"]
    for key in keys:
        values = [cell(cells.get((key, n)), value) for n in lengths]
        lines.append(f"| {key} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def series_label(row: dict, series_key: str, several_modes: bool) -> str:
    if series_key == "mode" or not several_modes:
        return str(row[series_key])
    return f"{row[series_key]} ({row['mode']})"


def plain_number(value: float) -> str:
    """A tick label without offset or scientific notation: 20, 1,000, 13,300, 0.5."""
    if value >= 10:
        return f"{value:,.0f}"
    return f"{value:.3g}"


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
    return [{"color": colours[i % 10], "ls": dashes[i // 10 % 3], "marker": markers[i // 10 % 3]}
            for i in range(n)]  # fmt: skip


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
                    r["ppl_sd"], r.get("ratio"), r.get("ratio_sd"))  # fmt: skip
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
        a.set_xscale("log", base=2)
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


def plot_ppl_vs_length(rows: list[dict], path: Path, series_key: str, title: str) -> None:
    """Perplexity vs eval length (log-x), one line per scheme (or mode); see ppl_yaxis."""
    save(ppl_figure(rows, series_key, title), path)


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
    ax.set_xscale("log", base=2)
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


def plot_loss_vs_position(rows: list[dict], path: Path, title: str) -> None:
    """Mean loss by position in the window, one line per (scheme, length), log-x positions."""
    save(position_figure(rows, title), path)


def write_reports(
    rows: list[dict],
    out: Path,
    title: str,
    series_key: str = "mode",
    stem: str = "extrapolation",
    text: str | None = None,
    position_rows: list[dict] | None = None,
) -> dict[str, Path]:
    """Write {stem}.json/.csv/.md, {stem}_ppl.png (ppl vs length, one line per `series_key`)
    and {stem}_loss_by_position.png to `out`; returns the paths. All or none: every file is
    rendered and written to a temporary first, and the set replaces the old one only once all
    are on disk (see write_all_or_none); a folder this call created is removed on failure."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno in NO_SPACE_ERRNOS:
            raise no_room_error(out, err) from None
        raise
    paths = {
        "json": out / f"{stem}.json",
        "csv": out / f"{stem}.csv",
        "md": out / f"{stem}.md",
        "ppl_plot": out / f"{stem}_ppl.png",
        "position_plot": out / f"{stem}_loss_by_position.png",
    }
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    files: dict[Path, FileWriter] = {
        paths["json"]: text_file(json.dumps(rows, indent=1)),
        paths["csv"]: text_file(table.getvalue()),
        paths["md"]: text_file((text or markdown(rows, title, series_key)) + "\n"),
    }
    figures: list[Figure] = []  # closed at the end, whatever happens

    def plot(path: Path, fig: Figure) -> None:
        figures.append(fig)
        files[path] = png_file(fig)

    try:
        if is_task(rows):  # accuracy, the condition heatmap, and the answer tokens' perplexity
            paths["accuracy_plot"] = out / f"{stem}_accuracy.png"
            plot(paths["accuracy_plot"], accuracy_figure(rows, series_key, title))
            heatmap = heatmap_figure(rows, series_key, title)
            if heatmap is not None:
                paths["heatmap"] = out / f"{stem}_heatmap.png"
                plot(paths["heatmap"], heatmap)
            tasks = ", ".join(dict.fromkeys(r["task"] for r in rows if r.get("task")))
            answer_title = f"{tasks}: answer perplexity" if tasks else "answer perplexity"
            plot(paths["ppl_plot"], ppl_figure(rows, series_key, answer_title))
            del paths["position_plot"]  # no loss by position for answers
        else:
            plot(paths["ppl_plot"], ppl_figure(rows, series_key, title))
            if position_rows is None:
                position_rows = [r for r in rows if r["mode"] == rows[0]["mode"]]
            position_title = f"{title}: loss by position"
            plot(paths["position_plot"], position_figure(position_rows, position_title))
        write_all_or_none(files)
    except BaseException:
        if created:  # nothing of this call left behind (an empty folder included)
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    finally:
        for fig in figures:
            plt.close(fig)
    return paths


def save(fig: Figure, path: Path) -> None:
    """One PNG, written atomically (see write_all_or_none); closes the figure."""
    try:
        write_all_or_none({path: png_file(fig)})
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# writing a set of files all or none

FileWriter = Callable[[IO[bytes]], None]  # writes one file's bytes to an open binary file


def text_file(text: str) -> FileWriter:
    data = text.encode()

    def write(f: IO[bytes]) -> None:
        f.write(data)

    return write


def png_file(fig: Figure) -> FileWriter:
    # format= because a file object has no suffix to tell matplotlib
    return lambda f: fig.savefig(f, dpi=120, format="png")


def temporary_path(path: Path) -> Path:
    """Where `path` is written before it replaces the old file: `.<name>.<pid>.tmp` in the same
    folder, so the rename stays on one file system (and compare.py never reads it)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def no_room_error(path: Path, err: OSError) -> ConfigError:
    return ConfigError(
        f"cannot write {path}: the disk is full ({err.strerror or os.strerror(err.errno or 0)}); "
        "the previous results are intact (nothing was replaced); free some space and run again"
    )


def write_all_or_none(files: dict[Path, FileWriter]) -> None:
    """Write a set of files (the results of one evaluation) so that readers see the whole old
    set or the whole new one: each file goes to `temporary_path`, flushed and fsync'd, and only
    once every one of them is on disk are they renamed over the old files (os.replace, atomic
    per file). A failure while writing (a full disk, a permission, a kill by an exception)
    removes the temporaries and leaves the previous files untouched; no room to write is a
    ConfigError naming the path. (The renames themselves only fail if the folder is removed
    under us; then the temporaries are removed too.)"""
    temporaries: list[tuple[Path, Path]] = []
    path: Path | None = None
    try:
        for path, write in files.items():
            tmp = temporary_path(path)
            temporaries.append((tmp, path))
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())  # on disk before the rename: a crash never shows an empty file
        for tmp, path in temporaries:
            os.replace(tmp, path)
    except BaseException as err:
        for tmp, _ in temporaries:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS and path is not None:
            raise no_room_error(path, err) from None
        raise
    for folder in {p.parent for p in files}:
        sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so the renames in it survive a crash (best effort: not every file
    system lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def markdown(rows: list[dict], title: str, row_key: str) -> str:
    """Tables of token perplexity and the tokenizer-independent metric; with row_key="scheme"
    one pair of tables per mode (a comparison), with row_key="mode" one pair (a single run)."""
    r0 = rows[0]
    parts = [f"## {title}", f"\n{r0['split']} split, trained at L={r0['train_length']}."]
    legend = []
    if any(str(r["status"]).startswith("skipped") for r in rows):
        legend.append("— = a length the scheme cannot represent (skipped)")
    if any(is_nonfinite(r) for r in rows):
        legend.append(f"{NONFINITE} = the model diverged there (NaN or inf loss)")
    if legend:
        parts[-1] += " " + "; ".join(legend) + "."
    if row_key == "scheme":
        parts[-1] += " " + seeds_note(rows)
    groups = (
        {"all modes": rows}
        if row_key == "mode"
        else {
            m: [r for r in rows if r["mode"] == m] for m in dict.fromkeys(r["mode"] for r in rows)
        }
    )
    for name, sub in groups.items():
        if is_task(sub):
            parts += task_tables(sub, name, row_key)
            continue
        other = metric_name(sub)
        parts += [
            f"\n### token perplexity ({name})\n",
            markdown_table(sub, "ppl", row_key),
            f"\n### {other.replace('_', ' ')} ({name})\n",
            markdown_table(sub, other, row_key),
        ]
    return "\n".join(parts)


def is_task(rows: list[dict]) -> bool:
    """Rows of a generated task's evaluation (accuracy), not of a corpus (perplexity)."""
    return any("accuracy" in r for r in rows)


def task_tables(rows: list[dict], name: str, row_key: str) -> list[str]:
    """The Markdown parts of a task's rows: exact-match accuracy, token accuracy, answer ppl."""
    chance = next((r for r in rows if is_finite(r.get("chance"))), None)
    note = (
        f"\nA uniform guess scores {chance['token_chance']:.3g} per answer token "
        f"({chance['chance']:.2g} exact match at L={chance['length']})."
        if chance
        else ""
    )
    return [
        f"\n### accuracy: the whole answer right ({name})\n",
        markdown_table(rows, "accuracy", row_key),
        f"\n### token accuracy: answer tokens right ({name})\n",
        markdown_table(rows, "token_accuracy", row_key),
        f"\n### answer perplexity ({name})\n",
        markdown_table(rows, "ppl", row_key),
        note,
    ]


def accuracy_figure(rows: list[dict], series_key: str, title: str) -> Figure:
    """Exact-match and token accuracy against evaluation length (log-x), one line per series,
    with a ± sd band for rows merged over seeds (callers close the figure)."""
    several_modes = len({r["mode"] for r in rows}) > 1
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6))
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok" and is_finite(r.get("accuracy")):
            series.setdefault(series_label(r, series_key, several_modes), []).append(r)
    for (label, pts), style in zip(series.items(), line_styles(len(series)), strict=True):
        pts = sorted(pts, key=lambda r: r["length"])
        for ax, value in zip(axes, ("accuracy", "token_accuracy"), strict=True):
            ax.plot([r["length"] for r in pts], [r[value] for r in pts], label=label, **style)
            if any(r.get("n_seeds", 1) > 1 for r in pts):
                band = [(r["length"], r[value], r.get(f"{value}_sd") or 0.0) for r in pts]
                sd_band(ax, band, style["color"])
    chances = {r["mode"]: r["token_chance"] for r in rows if is_finite(r.get("token_chance"))}
    for ax, what in zip(axes, ("whole answer right", "answer tokens right"), strict=True):
        for n in {r["train_length"] for r in rows}:
            ax.axvline(n, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("evaluation length (tokens); dotted: training length")
        ax.set_ylabel(f"accuracy ({what})")
        ax.grid(True, which="both", alpha=0.3)
        if not series:
            no_data_note(ax, "no accuracy to plot")
    for mode, chance in chances.items():  # a uniform guess, per task
        label = "chance" if len(chances) == 1 else f"chance ({mode})"
        axes[1].axhline(chance, color="grey", ls="--", lw=1, label=label)
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
            ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if value < 0.5 else "black")  # fmt: skip
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), shrink=0.8, label="accuracy")
    return fig


def load_rows(paths: Iterable[Path]) -> list[dict]:
    rows = []
    for p in paths:
        rows += json.loads(Path(p).read_text())
    return rows
