"""Learned at L with the uncertainty of a finite number of examples: a three-way verdict.

An accuracy of 0.908 on 250 examples is not "learned at 0.9": its 95% Wilson interval,
[0.866, 0.938], holds the line. Each seed's accuracy (over that seed's own examples) is judged:

* "learned" when the interval's lower bound is at or above the line (eval.learned_at),
* "not learned" when its upper bound is below the line,
* "unclear" when the interval holds the line: these examples cannot tell.

The effective length follows per seed, as two bounds: "sure", the longest length from L on up to
which every length is learned by the lower bound, and "possible", the longest up to which no
length is "not learned" by the upper bound. The point effective length (accuracy ≥ the line)
lies between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from poslab.report.intervals import wilson_interval

VERDICT_YES, UNCLEAR, VERDICT_NO = "learned", "unclear", "not learned"
# a verdict's mark after a seed's accuracy, so that the seeds on the line stand out
MARKS = {VERDICT_YES: "✓", UNCLEAR: "?", VERDICT_NO: "✗"}


@dataclass(frozen=True)
class SeedAccuracy:
    """One seed's accuracy at one length, with its Wilson interval and verdict (all None without
    an example count: then there is no interval to judge by)."""

    accuracy: float
    low: float | None = None
    high: float | None = None
    verdict: str | None = None

    def text(self) -> str:
        """0.908 [0.866, 0.938] ?"""
        if self.low is None or self.high is None or self.verdict is None:
            return f"{self.accuracy:.3f}"
        return f"{self.accuracy:.3f} [{self.low:.3f}, {self.high:.3f}] {MARKS[self.verdict]}"


def judged(accuracy: float, examples: int | None, line: float) -> SeedAccuracy:
    """`accuracy` over `examples` against `line`: its Wilson interval and verdict."""
    bounds = wilson_interval(accuracy * examples, examples) if examples else None
    if bounds is None:
        return SeedAccuracy(accuracy)
    low, high = bounds
    verdict = VERDICT_YES if low >= line else VERDICT_NO if high < line else UNCLEAR
    return SeedAccuracy(accuracy, low, high, verdict)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def examples_per_seed(row: dict) -> int | None:
    """The examples each seed scored at this row's length: `examples` (a merged row keeps the
    first seed's; every seed of a configuration scores eval.task_examples), else the pooled
    count shared out over the seeds; None where neither was recorded."""
    if _finite(row.get("examples")):
        return int(row["examples"])
    if _finite(row.get("examples_pooled")):
        return round(row["examples_pooled"] / row.get("n_seeds", 1))
    return None


def seed_accuracies(row: dict, line: float) -> dict[str, SeedAccuracy]:
    """seed -> its accuracy at this row's length, judged against `line`: from the row's
    per-seed values, or (a one-seed row without them) its own accuracy, under the key "".
    Empty for a row that is not ok or holds no accuracy (a merged row without per-seed values:
    the seeds cannot be told apart)."""
    if row.get("status") != "ok":
        return {}
    values = (row.get("per_seed") or {}).get("accuracy") or {}
    if not values and row.get("n_seeds", 1) == 1 and _finite(row.get("accuracy")):
        values = {"": row["accuracy"]}
    counted = (row.get("per_seed") or {}).get("examples") or {}  # each seed's own count
    n = examples_per_seed(row)
    return {
        seed: judged(a, int(counted.get(seed, n) or 0) or None, line)
        for seed, a in values.items()
        if _finite(a)
    }


def effective_lengths(
    by_length: dict[int, dict], train_length: int, line: float
) -> dict[str, tuple[int, int]]:
    """seed -> (sure, possible) effective length, from the rows of one configuration
    (`by_length`: length -> row): walking up from L, "sure" stops at the first length not
    learned by the lower bound, "possible" at the first one "not learned" by the upper bound
    (or with no verdict there: a skipped length, a seed without a value). 0: not at L."""
    lengths = sorted(n for n in by_length if n >= train_length)
    if train_length not in by_length:
        return {}
    seeds = [s for s, a in seed_accuracies(by_length[train_length], line).items() if a.verdict]
    out = {}
    for seed in seeds:
        verdicts = []
        for n in lengths:
            found = seed_accuracies(by_length[n], line).get(seed)
            verdicts.append(found.verdict if found else None)
        sure = _last_length_while(lengths, verdicts, {VERDICT_YES})
        possible = _last_length_while(lengths, verdicts, {VERDICT_YES, UNCLEAR})
        out[seed] = (sure, possible)
    return out


def _last_length_while(lengths: list[int], verdicts: list[str | None], kept: set[str]) -> int:
    """The longest of `lengths` up to which every verdict is in `kept` (0 if the first is not)."""
    last = 0
    for n, verdict in zip(lengths, verdicts, strict=True):
        if verdict not in kept:
            break
        last = n
    return last


def verdict_counts(at_l: dict[str, SeedAccuracy]) -> str:
    """ "learned 2, unclear 1, not learned 0 of 3", over the seeds with a verdict ("—": none)."""
    said = [a.verdict for a in at_l.values() if a.verdict]
    if not said:
        return "—"
    counts = ", ".join(f"{v} {said.count(v)}" for v in (VERDICT_YES, UNCLEAR, VERDICT_NO))
    return f"{counts} of {len(said)}"


@dataclass(frozen=True)
class LearningCells:
    """What the learning table adds for one configuration (report/tables.py)."""

    accuracies: str  # each seed's accuracy at L with its interval and mark, "; "-separated
    verdicts: str  # "learned 2, unclear 1, not learned 0 of 3"
    spans: str  # each seed's effective length, "sure–possible" (one number where they agree)
    every_seed_sure: bool | None  # by the lower bound; None: no verdict (no example count)


def learning_cells(rows: list[dict], line: float) -> LearningCells:
    """The learning table's cells for one configuration's rows (one per length)."""
    by_length = {r["length"]: r for r in rows}
    train_length = rows[0]["train_length"]
    at_l = seed_accuracies(by_length.get(train_length, {}), line)
    spans = effective_lengths(by_length, train_length, line)
    accuracies = "; ".join(a.text() for a in at_l.values()) or "—"
    lengths = "; ".join(
        f"{sure:,}" if sure == possible else f"{sure:,}–{possible:,}"
        for sure, possible in spans.values()
    )
    said = [a.verdict for a in at_l.values()]
    every = None if not said or None in said else all(v == VERDICT_YES for v in said)
    return LearningCells(accuracies, verdict_counts(at_l), lengths or "—", every)
