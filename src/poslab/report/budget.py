"""A study's budget axis: how each row's extrapolation moves as training grows.

    python scripts/budget.py RUNS... --baseline rope --out DIR [--primary]

The runs (folders, sweeps, a study's runs/ or evals/<name>/) are grouped by their training
budget (steps, from each row's provenance), each budget merged by compare.py on its own
(DIR/steps<N>/: the full table, paired differences, Holm over that table). Then, per row, mode
and budget, at the longest factor evaluated: the ratio of perplexity to that at 1× with its
95% interval over seeds, the difference to the baseline paired by seed, and the context gain
(nats) beyond `eval.short_context` tokens; and from the smallest budget to the largest, the
change of the ratio and of the difference, paired by seed (DIR/budget.md, .json, .png).

`--primary` adds the family declared before the paper_cpu study ran (docs/results.md): every
row minus the baseline at the longest factor and the largest budget, in every mode, with Holm
over exactly those differences.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.report.intervals import Interval, holm, paired_difference, t_interval


@dataclass
class Cell:
    """One row in one mode at one budget."""

    tokens: int | None
    ratio: Interval | None
    difference: Interval | None  # to the baseline at the longest factor, paired by seed
    gain: Interval | None  # context gain at the longest non-overlapping length
    # seed -> value, for the change between budgets
    ratios: dict[str, float] = field(default_factory=dict)
    differences: dict[str, float] = field(default_factory=dict)


def group_by_budget(paths: list[str | Path]) -> dict[int, list[Path]]:
    """The results under `paths`, grouped by training steps (their provenance)."""
    from poslab.report.compare import read_result, results_under
    from poslab.report.provenance import provenance_of_run

    results = results_under(paths)
    groups: dict[int, list[Path]] = {}
    for result in results:
        steps = provenance_of_run(result.parent.parent, read_result(result)).get("steps")
        if not isinstance(steps, int):
            raise ConfigError(
                f"{result} records no training steps; the budget axis needs runs whose config "
                "or rows say trainer.max_steps"
            )
        groups.setdefault(steps, []).append(result)
    if len(groups) < 2:
        raise ConfigError(
            f"the runs under {', '.join(map(str, paths))} have one budget "
            f"({', '.join(map(str, groups))} steps); a budget axis needs two or more"
        )
    return dict(sorted(groups.items()))


def budget_cells(rows: list[dict], baseline: str) -> tuple[dict[tuple[str, str], Cell], float]:
    """(row, mode) -> its Cell at this budget, and the longest factor they were scored at."""
    from poslab.report.compare import ratio_interval, row_at

    factor = max(r["factor"] for r in rows if r.get("status") == "ok")
    cells = {}
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            far, base = row_at(rows, scheme, mode, factor), row_at(rows, baseline, mode, factor)
            if far is None:
                continue
            mine = (far.get("per_seed") or {}).get("ppl") or {}
            theirs = ((base or {}).get("per_seed") or {}).get("ppl") or {}
            shared = {s: mine[s] - theirs[s] for s in mine if s in theirs}
            gains = (far.get("per_seed") or {}).get("context_gain") or {}
            gain = t_interval(list(gains.values())) if gains else None
            cells[scheme, mode] = Cell(
                tokens=(far.get("provenance") or {}).get("train_tokens"),
                ratio=ratio_interval(rows, scheme, mode, factor),
                difference=(
                    paired_difference(mine, theirs) if scheme != baseline and shared else None
                ),
                gain=gain,
                ratios=dict((far.get("per_seed") or {}).get("ratio") or {}),
                differences=shared if scheme != baseline else {},
            )
    return cells, factor


def interval_text(i: Interval | None, digits: int = 2, signed: bool = False) -> str:
    if i is None:
        return "—"
    sign = "+" if signed else ""
    value = f"{i.mean:{sign}.{digits}f}"
    if i.low is None or i.high is None:
        return f"{value} (n = {i.n})"
    return f"{value} [{i.low:{sign}.{digits}f}, {i.high:{sign}.{digits}f}]"


def seeds_text(cell: Cell) -> str:
    """How many seeds the cell's ratio rests on, and how many of them its difference pairs
    with the baseline where that is fewer (a seed the baseline lacks)."""
    n = cell.ratio.n if cell.ratio is not None else len(cell.ratios)
    paired = len(cell.differences)
    return f"{n} ({paired} paired)" if cell.differences and paired != n else str(n)


def change(first: dict[str, float], last: dict[str, float]) -> Interval | None:
    """last − first over the seeds both have, paired (None with fewer than one shared)."""
    if not first or not last:
        return None
    return paired_difference(last, first)


def budget_table(
    budgets: dict[int, dict[tuple[str, str], Cell]], baseline: str, factor: float
) -> tuple[str, list[dict]]:
    """The Markdown table and its JSON records: one line per row, mode and budget."""
    steps = list(budgets)
    lines = [
        f"| row | mode | steps | training tokens | seeds | ratio {factor:g}× ÷ 1× | − {baseline} "
        f"at {factor:g}× (ppl) | context gain at {factor:g}× (nats) |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    records = []
    keys = list(dict.fromkeys(k for cells in budgets.values() for k in cells))
    for scheme, mode in keys:
        for n in steps:
            cell = budgets[n].get((scheme, mode))
            if cell is None:
                continue
            tokens = f"{cell.tokens:,}" if cell.tokens else "—"
            lines.append(
                f"| {scheme} | {mode} | {n:,} | {tokens} | {seeds_text(cell)} | "
                f"{interval_text(cell.ratio)} | "
                f"{interval_text(cell.difference, 2, True)} | "
                f"{interval_text(cell.gain, 3, True)} |"
            )
            records.append(
                {
                    "scheme": scheme,
                    "mode": mode,
                    "steps": n,
                    "train_tokens": cell.tokens,
                    "ratio": _record(cell.ratio),
                    "difference": _record(cell.difference),
                    "context_gain": _record(cell.gain),
                }
            )
    return "\n".join(lines), records


def change_table(
    budgets: dict[int, dict[tuple[str, str], Cell]], baseline: str, factor: float
) -> tuple[str, list[dict]]:
    """From the smallest budget to the largest, per row and mode: the change of the ratio and
    of the difference to the baseline, paired by seed, with Holm over this table."""
    first, last = budgets[min(budgets)], budgets[max(budgets)]
    found: dict[str, list[Interval | None]] = {}
    records = []
    for key in last:
        if key not in first:
            continue
        ratio = change(first[key].ratios, last[key].ratios)
        diff = change(first[key].differences, last[key].differences)
        found[f"{key[0]} ({key[1]})"] = [ratio, diff]
        records.append(
            {"scheme": key[0], "mode": key[1], "ratio": _record(ratio), "difference": _record(diff)}
        )
    family = [(k, j) for k, cells in found.items() for j, i in enumerate(cells) if _has_p(i)]
    adjusted = dict(zip(family, holm([found[k][j].p for k, j in family]), strict=True))
    lines = [
        f"| row (mode) | seeds paired | ratio {factor:g}×: {max(budgets):,} − {min(budgets):,} "
        f"steps | Holm p | − {baseline}: {max(budgets):,} − {min(budgets):,} steps | Holm p |",
        "|---|---:|---|---:|---|---:|",
    ]
    for name, (ratio, diff) in found.items():
        ps = [adjusted.get((name, j)) for j in (0, 1)]
        texts = [p_text(p, 3) for p in ps]
        seeds = "/".join(dict.fromkeys(str(i.n) for i in (ratio, diff) if i is not None))
        lines.append(
            f"| {name} | {seeds or '—'} | {interval_text(ratio, 3, True)} | {texts[0]} | "
            f"{interval_text(diff, 2, True)} | {texts[1]} |"
        )
    for record in records:
        name = f"{record['scheme']} ({record['mode']})"
        record["holm_p"] = [adjusted.get((name, j)) for j in (0, 1)]
    note = f"\n\nHolm over the {len(family)} changes of this table (exploratory)."
    return "\n".join(lines) + note, records


def primary_family(
    budgets: dict[int, dict[tuple[str, str], Cell]], baseline: str, factor: float
) -> tuple[str, list[dict]]:
    """The declared primary family: every row minus the baseline at the longest factor and the
    largest budget, every mode, Holm over exactly these."""
    last = budgets[max(budgets)]
    family = [
        (key, cell.difference)
        for key, cell in last.items()
        if key[0] != baseline and cell.difference is not None
    ]
    adjusted = holm([i.p if _has_p(i) else 1.0 for _, i in family])
    lines = [
        f"| # | difference at {factor:g}×, {max(budgets):,} steps | mode | seeds | "
        f"ppl, 95% interval | p | Holm p (over these {len(family)}) |",
        "|---:|---|---|---:|---|---:|---:|",
    ]
    records = []
    for k, ((scheme, mode), interval) in enumerate(family, 1):
        plain = p_text(interval.p if _has_p(interval) else None, 4)
        corrected = p_text(adjusted[k - 1] if _has_p(interval) else None, 4)
        lines.append(
            f"| {k} | {scheme} − {baseline} | {mode} | {interval.n} | "
            f"{interval_text(interval, 2, True)} | "
            f"{plain} | {corrected} |"
        )
        records.append(
            {
                "scheme": scheme,
                "mode": mode,
                "difference": _record(interval),
                "holm_p": adjusted[k - 1],
            }
        )
    return "\n".join(lines), records


def p_text(p: float | None, digits: int) -> str:
    """A p-value as every table shows it (report/differences.py), or "—" where there is none."""
    from poslab.report.differences import p_text as shown

    return "—" if p is None else shown(p, digits)


def _has_p(i: Interval | None) -> bool:
    return i is not None and i.p is not None


def _record(i: Interval | None) -> dict[str, Any] | None:
    if i is None:
        return None
    return {"mean": i.mean, "low": i.low, "high": i.high, "n": i.n, "p": i.p}


def budget_figure(
    budgets: dict[int, dict[tuple[str, str], Cell]], baseline: str, factor: float, title: str
) -> Any:
    """Per mode: the ratio at the longest factor and the difference to the baseline, against
    training tokens (log axis), each row one style, 95% intervals as capped bars. Where rows
    lie orders of magnitude apart (the sinusoid's hundreds beside ALiBi's tens), the ratio gets
    a log axis and the difference a symmetric log axis, so that no row flattens the others."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    from poslab.plotting import styles_for

    modes = list(dict.fromkeys(mode for cells in budgets.values() for _, mode in cells))
    schemes = list(dict.fromkeys(s for cells in budgets.values() for s, _ in cells))
    styles = styles_for(schemes)
    fig, axes = plt.subplots(
        len(modes), 2, figsize=(11, 3.6 * len(modes)), squeeze=False, sharex=True
    )
    for row_axes, mode in zip(axes, modes, strict=True):
        panels: list[tuple[Any, Callable[[Cell], Interval | None], str]] = [
            (row_axes[0], lambda c: c.ratio, f"ppl at {factor:g}× ÷ ppl at 1× ({mode})"),
            (row_axes[1], lambda c: c.difference, f"ppl − {baseline} at {factor:g}× ({mode})"),
        ]
        for ax, pick, label in panels:
            drawn: list[float] = []
            for k, scheme in enumerate(schemes):
                points = [
                    (cells[scheme, mode].tokens, pick(cells[scheme, mode]))
                    for cells in budgets.values()
                    if (scheme, mode) in cells and cells[scheme, mode].tokens
                ]
                points = [(t, i) for t, i in points if i is not None]
                if not points:
                    continue
                # rows side by side at each budget so no bar hides another
                xs = [t * (1.0 + 0.03 * (k - (len(schemes) - 1) / 2)) for t, _ in points]
                ys = [i.mean for _, i in points]
                low = [i.mean - (i.low if i.low is not None else i.mean) for _, i in points]
                high = [(i.high if i.high is not None else i.mean) - i.mean for _, i in points]
                ax.errorbar(xs, ys, yerr=[low, high], capsize=3, label=scheme, **styles[scheme])
                drawn += ys
            ax.axhline(1.0 if ax is row_axes[0] else 0.0, color="0.5", lw=0.8)
            ax.set_xscale("log")
            label += spread_axis(ax, drawn, ratio=ax is row_axes[0])
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    budget_tokens = sorted(
        {cell.tokens for cells in budgets.values() for cell in cells.values() if cell.tokens}
    )
    for ax in axes.flat:  # each budget's tokens named at its own tick
        ax.set_xticks(budget_tokens, [f"{t / 1e6:.1f}M" for t in budget_tokens])
        ax.xaxis.set_minor_locator(NullLocator())
    for ax in axes[-1]:
        ax.set_xlabel("training tokens (log)")
    axes[0][0].legend(loc="best", fontsize=8)
    seeds = seed_counts(budgets)
    fig.suptitle(f"{title}\neach row at each budget, 95% intervals over {seeds} seeds", fontsize=10)
    fig.tight_layout()
    return fig


def seed_counts(budgets: dict[int, dict[tuple[str, str], Cell]]) -> str:
    """How many seeds the figure's ratios rest on: "5", or "3–5" where cells differ."""
    counts = sorted(
        {c.ratio.n for cells in budgets.values() for c in cells.values() if c.ratio is not None}
    )
    return "–".join(str(n) for n in dict.fromkeys([counts[0], counts[-1]])) if counts else "?"


def spread_axis(ax: Any, values: list[float], ratio: bool) -> str:
    """A log axis for ratios spanning more than 3×, a symmetric log axis for differences whose
    sizes span more than 20× (linear within the smallest's decade); what the label adds."""
    sizes = [abs(v) for v in values if v and math.isfinite(v)]
    if not sizes:
        return ""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda y, _: f"{y:g}")
    if ratio and max(sizes) / min(sizes) > 3:  # sizes hold no 0
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        return " (log)"
    if not ratio and max(sizes) / min(sizes) > 20:
        linear = 10 ** math.floor(math.log10(min(sizes)))
        ax.set_yscale("symlog", linthresh=linear, linscale=0.3)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
        return " (symlog)"
    return ""


def budget_report(
    paths: list[str | Path], out: str | Path, baseline: str, title: str, primary: bool = False
) -> dict[str, Any]:
    """Write DIR/steps<N>/ (compare.py per budget) and DIR/budget.{md,json,png}."""
    from poslab.report.compare import compare
    from poslab.report.files import write_all_or_none
    from poslab.report.provenance import caption

    out = Path(out)
    check_writable(out, "--out")
    groups = group_by_budget(paths)
    budgets: dict[int, dict[tuple[str, str], Cell]] = {}
    factor = math.inf
    all_rows = []
    for steps, results in groups.items():
        rows = compare(
            results, out / f"steps{steps}", title=f"{title}, {steps:,} steps", baseline=baseline
        )
        all_rows += rows
        budgets[steps], longest = budget_cells(rows, baseline)
        factor = min(factor, longest)
    table, records = budget_table(budgets, baseline, factor)
    changes, change_records = change_table(budgets, baseline, factor)
    text = [
        f"## {title}: the budget axis\n",
        f"Per row and budget, at {factor:g}× the training length: the ratio to 1× (mean, 95% "
        f"t interval over seeds), the difference to {baseline} (paired by seed), and the context "
        "gain. Each budget's full table: steps<N>/comparison.md.\n",
        f"*{caption(all_rows)}*\n",
        table,
        f"\n\n### from {min(budgets):,} to {max(budgets):,} steps (paired by seed)\n",
        changes,
    ]
    result: dict[str, Any] = {"factor": factor, "budgets": records, "changes": change_records}
    if primary:
        family, family_records = primary_family(budgets, baseline, factor)
        text += ["\n\n### the primary family (declared before the runs)\n", family]
        result["primary"] = family_records
    figure = budget_figure(budgets, baseline, factor, title)
    note = textwrap.fill(caption(all_rows), 190)
    figure.text(0.01, -0.01, note, ha="left", va="top", fontsize=6.5, color="0.35")
    from poslab.report.files import png_file, text_file

    try:
        write_all_or_none(
            {
                out / "budget.md": text_file("\n".join(text) + "\n"),
                out / "budget.json": text_file(json.dumps(result, indent=1)),
                out / "budget.png": png_file(figure, tight=True),
            }
        )
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    print("\n".join(text), flush=True)
    print(f"\nwrote budget.{{md,json,png}} to {out}", flush=True)
    return result


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/budget.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders, sweeps, a study's runs/ or evals/X/")
    parser.add_argument("--out", required=True, help="folder for steps<N>/ and budget.*")
    parser.add_argument(
        "--baseline", required=True, help="the row every difference is taken to, e.g. rope"
    )
    parser.add_argument("--title", default="perplexity vs training budget")
    parser.add_argument(
        "--primary",
        action="store_true",
        help="add the declared primary family (every row − baseline at the longest factor and "
        "the largest budget, every mode; Holm over those)",
    )
    args = parser.parse_args(argv)
    budget_report(args.paths, args.out, args.baseline, args.title, args.primary)
