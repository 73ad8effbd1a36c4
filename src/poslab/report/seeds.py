"""Runs that differ only in their seed, merged into one row per length: the mean, the sample
standard deviation (n − 1) and the number of seeds, for every metric the rows hold.

The per-seed ratio to the training length (`ratio`, `ratio_sd`) is taken seed by seed (each
seed's perplexity at k× over its own at 1×), so the spread of a shape is not inflated by the
seeds' different levels.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from poslab.report.tables import NONFINITE, is_finite, is_nonfinite

# the metrics averaged over seeds when every seed's row has them
METRICS = (
    "loss",
    "ppl",
    "word_ppl",
    "bits_per_byte",
    "accuracy",
    "token_accuracy",
    "tokens_per_s",
    "shortcut",
    "shortcut_token",
    # eval.short_context (context_use.py)
    "context_gain",
    "key_token_share",
    "key_token_ppl",
)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0.0 for a single value)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


BUCKETED = ("loss_by_position", "gain_by_distance")  # [start, mean, count] per bucket


def mean_buckets(rows: list[dict], key: str = "loss_by_position") -> list[list] | None:
    """The buckets of `key` (loss by position, context gain by distance) averaged over seeds
    (token-weighted), when every seed has the same buckets; None otherwise."""
    all_buckets = [r.get(key) for r in rows]
    if not all(all_buckets) or len({tuple(b[0] for b in bs) for bs in all_buckets}) != 1:
        return None
    merged = []
    for parts in zip(*all_buckets, strict=True):
        count = sum(c for _, _, c in parts)
        finite = all(is_finite(m) for _, m, _ in parts)
        mean = sum(m * c for _, m, c in parts) / count if count and finite else math.nan
        merged.append([parts[0][0], mean, count])
    return merged


def mean_conditions(rows: list[dict]) -> list[dict] | None:
    """A task's accuracy per condition (passkey depth) averaged over seeds, when every seed
    measured the same conditions; None otherwise."""
    tables = [r.get("by_condition") for r in rows]
    if not all(tables) or len({repr([c["condition"] for c in t]) for t in tables}) != 1:
        return None
    merged = []
    for cells in zip(*tables, strict=True):
        cell: dict[str, Any] = {
            "condition": cells[0]["condition"],
            "examples": sum(c["examples"] for c in cells),
        }
        for key in ("accuracy", "token_accuracy", "loss"):
            if all(is_finite(c.get(key)) for c in cells):
                cell[key], cell[f"{key}_sd"] = mean_sd([c[key] for c in cells])
        merged.append(cell)
    return merged


def seed_ratios(runs: list[tuple[Any, list[dict]]]) -> dict[tuple, list[float]]:
    """(mode, length) -> each seed's perplexity there over its own at the training length."""
    return {key: list(by_seed.values()) for key, by_seed in seed_ratios_by_seed(runs).items()}


# the metrics kept seed by seed in a row's `per_seed` (what a paired comparison reads), and
# each seed's example count (what its accuracy's interval counts: seeds may score differently)
PER_SEED = (
    "ppl",
    "loss",
    "accuracy",
    "token_accuracy",
    "context_gain",
    "key_token_share",
    "examples",
)


def seed_ratios_by_seed(runs: list[tuple[Any, list[dict]]]) -> dict[tuple, dict[str, float]]:
    """(mode, length) -> {seed: that seed's perplexity there over its own at the training
    length}."""
    ratios: dict[tuple, dict[str, float]] = {}
    for seed, rows in runs:
        at_one = {
            r["mode"]: r["ppl"]
            for r in rows
            if r.get("factor") == 1.0
            and r["status"] == "ok"
            and is_finite(r.get("ppl"))
            and r["ppl"] > 0
        }
        for r in rows:
            if r["mode"] in at_one and r["status"] == "ok" and is_finite(r.get("ppl")):
                ratios.setdefault((r["mode"], r["length"]), {})[str(seed)] = (
                    r["ppl"] / at_one[r["mode"]]
                )
    return ratios


def per_seed_values(runs: list[tuple[Any, list[dict]]]) -> dict[tuple, dict[str, dict]]:
    """(mode, length) -> {metric: {seed: value}} for PER_SEED and `ratio`, over the runs whose
    row there is ok and finite: what lets a later comparison pair two schemes seed by seed
    (kept in the rows as `per_seed`, so a committed comparison.json can still be paired)."""
    values: dict[tuple, dict[str, dict]] = {}
    for seed, rows in runs:
        for r in rows:
            if r["status"] != "ok" or is_nonfinite(r):
                continue
            cell = values.setdefault((r["mode"], r["length"]), {})
            for metric in PER_SEED:
                if is_finite(r.get(metric)):
                    cell.setdefault(metric, {})[str(seed)] = r[metric]
    for key, by_seed in seed_ratios_by_seed(runs).items():
        if key in values:
            values[key]["ratio"] = by_seed
    return values


def coarse_buckets(buckets: list[list], per_octave: int = 12) -> list[list]:
    """Buckets [start, mean, count] merged (token-weighted) into `per_octave` groups per octave of
    position: a band over seeds needs no finer grain, and a 2048-token row keeps ~130 buckets
    instead of 512 per seed."""
    groups: dict[int, list] = {}
    for start, mean, count in buckets:
        group = groups.setdefault(int(per_octave * math.log2(start + 1)), [start, 0.0, 0])
        group[1] += mean * count if is_finite(mean) else math.nan
        group[2] += count
    return [
        [start, total / count if count else math.nan, count]
        for start, total, count in groups.values()
    ]


def seed_buckets(seeded: list[tuple[Any, dict]]) -> dict[str, dict]:
    """{"loss_by_position": {seed: coarse buckets}} when two or more seeds kept their loss by
    position (a figure's band over seeds), else {}."""
    by_seed = {
        str(s): coarse_buckets(r["loss_by_position"])
        for s, r in seeded
        if r.get("loss_by_position")
    }
    return {"loss_by_position": by_seed} if len(by_seed) >= 2 else {}


def merge_seeds(runs: list[tuple[Any, list[dict]]], scheme: str) -> list[dict]:
    """One row per (mode, length) for runs [(seed, rows), ...] of one configuration: status "ok"
    with `<metric>` the mean and `<metric>_sd` the spread when every seed's row is ok;
    "nonfinite" when any seed diverged there; the first seed's "skipped: ..." when skipped."""
    cells: dict[tuple, list[tuple[Any, dict]]] = {}
    for seed, rows in runs:
        for r in rows:
            cells.setdefault((r["mode"], r["length"]), []).append((seed, r))
    ratios = seed_ratios(runs)
    kept = per_seed_values(runs)
    longest: dict[str, int] = {}
    for mode, length in cells:
        longest[mode] = max(length, longest.get(mode, length))
    merged = []
    for key, seeded in cells.items():
        rows = [r for _, r in seeded]
        row = {k: v for k, v in rows[0].items() if k not in METRICS and k not in BUCKETED}
        row.update(scheme=scheme, n_seeds=len(rows), seeds=" ".join(str(s) for s, _ in seeded))
        skipped = [r for r in rows if str(r["status"]).startswith("skipped")]
        if skipped:
            row["status"] = skipped[0]["status"]
        elif any(is_nonfinite(r) for r in rows):
            row["status"] = NONFINITE
            row.update(ppl=math.nan, loss=math.nan)
        elif all(r["status"] == "ok" for r in rows):
            for metric in METRICS:
                values = [r.get(metric) for r in rows]
                if all(is_finite(v) for v in values):
                    row[metric], row[f"{metric}_sd"] = mean_sd(values)
            if len(ratios.get(key, [])) == len(rows):
                row["ratio"], row["ratio_sd"] = mean_sd(ratios[key])
            for bucketed in BUCKETED:
                buckets = mean_buckets(rows, bucketed)
                if buckets:
                    row[bucketed] = buckets
            row["by_condition"] = mean_conditions(rows)
            row["per_seed"] = kept.get(key, {})
            if key[1] == longest.get(key[0]):  # what the loss-by-position figure draws a band of
                row["per_seed"] |= seed_buckets(seeded)
            if is_finite(rows[0].get("examples")):  # what an accuracy's interval counts
                row["examples_pooled"] = sum(r.get("examples") or 0 for r in rows)
        else:
            row["status"] = next(r["status"] for r in rows if r["status"] != "ok")
        if "learned" in rows[0]:
            row.update(learning_over_seeds(rows))
        merged.append(row)
    return merged


def learning_over_seeds(rows: list[dict]) -> dict[str, Any]:
    """A task configuration over its seeds: learned (every seed learned at L; None when any
    seed's training length was not evaluated), the seeds that learned, and the effective length
    and steps to learn as mean ± sd (steps over the seeds that reached the threshold)."""
    said = [r.get("learned") for r in rows]
    out: dict[str, Any] = {
        "learned": None if None in said else all(said),
        "learned_seeds": sum(1 for s in said if s is True),
    }
    out["effective_length"], out["effective_length_sd"] = mean_sd(
        [float(r.get("effective_length") or 0) for r in rows]
    )
    steps = [r["steps_to_learn"] for r in rows if is_finite(r.get("steps_to_learn"))]
    out["steps_to_learn"], out["steps_to_learn_sd"] = mean_sd(steps) if steps else (None, None)
    out["steps_learned"] = len(steps)
    return out
