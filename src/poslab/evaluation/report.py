"""Extrapolation results as files: JSON (everything), CSV, a Markdown table, PNG plots."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

CSV_FIELDS = [
    "scheme", "train_length", "mode", "split", "length", "factor", "status", "tokens", "loss",
    "ppl", "word_ppl", "bits_per_byte", "tokens_per_s", "seconds",
]  # fmt: skip


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}" if value < 1e5 else f"{value:.3g}"


def metric_name(rows: list[dict]) -> str:
    """The tokenizer-independent metric of these rows: word_ppl or bits_per_byte."""
    return (
        "word_ppl"
        if all(r.get("word_level") for r in rows if r["status"] == "ok")
        else "bits_per_byte"
    )


def markdown_table(rows: list[dict], value: str = "ppl", row_key: str = "scheme") -> str:
    """Rows = `row_key` values (schemes, or modes), columns = eval lengths, cells = `value`."""
    lengths = sorted({r["length"] for r in rows})
    keys = list(dict.fromkeys(r[row_key] for r in rows))
    cell = {(r[row_key], r["length"]): r for r in rows}
    head = f"| {row_key} | " + " | ".join(str(n) for n in lengths) + " |"
    lines = [head, "|---" * (len(lengths) + 1) + "|"]
    for key in keys:
        values = []
        for n in lengths:
            r = cell.get((key, n))
            values.append("—" if r is None or r["status"] != "ok" else fmt(r[value]))
        lines.append(f"| {key} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def series_label(row: dict, series_key: str, several_modes: bool) -> str:
    if series_key == "mode" or not several_modes:
        return str(row[series_key])
    return f"{row[series_key]} ({row['mode']})"


def plot_ppl_vs_length(rows: list[dict], path: Path, series_key: str, title: str) -> None:
    """Perplexity vs eval length on log axes, one line per scheme (or mode)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    several_modes = len({r["mode"] for r in rows}) > 1
    series: dict[str, list] = {}
    for r in rows:
        if r["status"] == "ok":
            series.setdefault(series_label(r, series_key, several_modes), []).append(
                (r["length"], r["ppl"])
            )
    for label, pts in series.items():
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label)
    train_lengths = {r["train_length"] for r in rows}
    for n in train_lengths:
        ax.axvline(n, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("evaluation length (tokens); dotted: training length")
    ax.set_ylabel("perplexity")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def log_binned(buckets: list[list], bins_per_octave: int = 6) -> tuple[list[float], list[float]]:
    """Token-weighted mean loss in log-spaced position bins (a readable curve on a log axis
    from the fine, equal-width buckets stored in the results)."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for start, mean, count in buckets:
        b = int(math.floor(math.log2(start + 1) * bins_per_octave))
        sums[b] = sums.get(b, 0.0) + mean * count
        counts[b] = counts.get(b, 0) + count
    keys = sorted(sums)
    return [2 ** ((b + 0.5) / bins_per_octave) for b in keys], [sums[b] / counts[b] for b in keys]


def plot_loss_vs_position(rows: list[dict], path: Path, title: str) -> None:
    """Mean loss by position in the window, one line per (scheme, length), log-x positions."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in rows:
        if r["status"] != "ok" or not r.get("loss_by_position"):
            continue
        xs, ys = log_binned(r["loss_by_position"])
        ax.plot(xs, ys, label=f"{r['scheme']} L={r['length']}", lw=1.4)
    for n in {r["train_length"] for r in rows}:
        ax.axvline(n, color="grey", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in window (+1); dotted: training length")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    and {stem}_loss_by_position.png to `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / f"{stem}.json",
        "csv": out / f"{stem}.csv",
        "md": out / f"{stem}.md",
        "ppl_plot": out / f"{stem}_ppl.png",
        "position_plot": out / f"{stem}_loss_by_position.png",
    }
    paths["json"].write_text(json.dumps(rows, indent=1))
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    paths["md"].write_text((text or markdown(rows, title, series_key)) + "\n")
    plot_ppl_vs_length(rows, paths["ppl_plot"], series_key, title)
    if position_rows is None:
        position_rows = [r for r in rows if r["mode"] == rows[0]["mode"]]
    plot_loss_vs_position(position_rows, paths["position_plot"], f"{title}: loss by position")
    return paths


def markdown(rows: list[dict], title: str, row_key: str) -> str:
    """Tables of token perplexity and the tokenizer-independent metric; with row_key="scheme"
    one pair of tables per mode (a comparison), with row_key="mode" one pair (a single run)."""
    r0 = rows[0]
    parts = [f"## {title}", f"\n{r0['split']} split, trained at L={r0['train_length']}."]
    groups = (
        {"all modes": rows}
        if row_key == "mode"
        else {
            m: [r for r in rows if r["mode"] == m] for m in dict.fromkeys(r["mode"] for r in rows)
        }
    )
    for name, sub in groups.items():
        other = metric_name(sub)
        parts += [
            f"\n### token perplexity ({name})\n",
            markdown_table(sub, "ppl", row_key),
            f"\n### {other.replace('_', ' ')} ({name})\n",
            markdown_table(sub, other, row_key),
        ]
    return "\n".join(parts)


def load_rows(paths: Iterable[Path]) -> list[dict]:
    rows = []
    for p in paths:
        rows += json.loads(Path(p).read_text())
    return rows
