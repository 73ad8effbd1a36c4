"""Each scheme minus a baseline scheme, with a 95% interval: what the comparison table's
"difference to" section prints and what its difference figure draws (one computation for both).

Paired by seed where both rows kept per-seed values (the seeds both ran), else Welch's interval
from the rows' mean ± sd over seeds, else (a one-seed side) the difference alone, no interval.

A table of differences tests many at once: `holm_table` gives, below it, each difference's
two-sided p adjusted over all the differences of that table (Holm), so that a reader does not
take the one in twenty that excludes 0 by chance for an effect.
"""

from __future__ import annotations

from dataclasses import dataclass

from poslab.report.intervals import (
    Interval,
    holm,
    paired_difference,
    welch_from_summaries,
)
from poslab.report.tables import is_finite


@dataclass
class DifferenceSet:
    """Every scheme's difference to `baseline` in one evaluation mode, at each of `lengths`
    (None where either row lacks that length)."""

    baseline: str
    mode: str
    metric: str  # "ppl" or "accuracy"
    lengths: list[int]
    by_scheme: dict[str, list[Interval | None]]
    factors: dict[int, float]  # length -> its multiple of the training length, where known
    base_values: dict[int, float]  # length -> the baseline's own value (what a difference is of)

    @property
    def lower_is_better(self) -> bool:
        return self.metric == "ppl"


def difference(row: dict, base: dict, metric: str) -> Interval | None:
    """`row` − `base` in `metric`, paired by seed where both kept per-seed values (`per_seed`),
    else Welch's interval from the rows' mean ± sd over seeds, else None."""
    if not all(r["status"] == "ok" for r in (row, base)):
        return None
    mine, theirs = (r.get("per_seed", {}).get(metric) for r in (row, base))
    found = paired_difference(mine, theirs) if mine and theirs else None
    if found is not None:
        return found
    summaries = [(r.get(metric), r.get(f"{metric}_sd"), r.get("n_seeds", 1)) for r in (row, base)]
    if all(is_finite(m) and is_finite(sd) for m, sd, _ in summaries):
        return welch_from_summaries(*summaries)
    if all(is_finite(m) for m, _, _ in summaries):  # a one-seed side: the difference alone
        return Interval(summaries[0][0] - summaries[1][0], None, None, 1)
    return None


def difference_set(rows: list[dict], baseline: str, mode: str) -> DifferenceSet:
    """Each scheme of `rows` in `mode` (but the baseline) minus `baseline` at every length both
    evaluated: perplexity, or accuracy for a task's rows. Schemes with no difference at any
    length are left out."""
    sub = [r for r in rows if r["mode"] == mode]
    metric = "accuracy" if any(r.get("task") for r in sub) else "ppl"
    cells = {(r["scheme"], r["length"]): r for r in sub}
    lengths = sorted({r["length"] for r in sub})
    by_scheme = {}
    for scheme in dict.fromkeys(r["scheme"] for r in sub):
        if scheme == baseline:
            continue
        found = [
            difference(cells[scheme, n], cells[baseline, n], metric)
            if (scheme, n) in cells and (baseline, n) in cells
            else None
            for n in lengths
        ]
        if any(found):
            by_scheme[scheme] = found
    base_rows = [r for r in sub if r["scheme"] == baseline]
    factors = {r["length"]: r["factor"] for r in base_rows if is_finite(r.get("factor"))}
    values = {r["length"]: r[metric] for r in base_rows if is_finite(r.get(metric))}
    return DifferenceSet(baseline, mode, metric, lengths, by_scheme, factors, values)


def p_text(p: float, digits: int = 3) -> str:
    """A p-value as a table shows it: `digits` decimals, "<0.001" (for 3) below that."""
    smallest = 10.0**-digits
    return f"<{smallest:.{digits}f}" if p < smallest else f"{p:.{digits}f}"


def holm_table(found: dict[str, list[Interval | None]], columns: list[str]) -> str:
    """A Markdown block for directly below a table of differences (`found`: row -> its
    differences, one per column of `columns`): each difference's two-sided p adjusted by Holm
    over the family of every difference of that table with an interval, the plain p in
    parentheses, and a sentence naming the family; "" when no difference has a p (one seed)."""
    family = [
        (name, j)
        for name, cells in found.items()
        for j, interval in enumerate(cells)
        if interval is not None and interval.p is not None
    ]
    if not family:
        return ""
    adjusted = dict(zip(family, holm([found[k][j].p for k, j in family]), strict=True))
    lines = [f"| scheme | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    for name, cells in found.items():
        if not any((name, j) in adjusted for j in range(len(cells))):
            continue  # a row of one-seed differences: no p to show
        texts = [
            f"{p_text(adjusted[name, j])} ({p_text(i.p)})" if (name, j) in adjusted else "—"
            for j, i in enumerate(cells)
        ]
        lines.append(f"| {name} | {' | '.join(texts)} |")
    return (
        "\n\nHolm-adjusted p (plain p in parentheses): two-sided, from the t statistic and "
        "degrees of freedom of each interval above.\n\n"
        + "\n".join(lines)
        + f"\n\nHolm over the {len(family)} differences of this table that have an interval: "
        "a Holm p below 0.05 is a difference that stays distinguishable when all of them are "
        "tested at once."
    )
