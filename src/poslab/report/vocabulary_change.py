"""Does a change of set-up (the word vocabulary, say) change a comparison between schemes?

    python scripts/vocabulary_change.py OLD_TABLE NEW_RUNS... --baseline rope --out DIR

OLD_TABLE is a committed comparison.json whose rows kept each seed's perplexity (`per_seed`);
NEW_RUNS are runs (or a committed folder of them) of the same schemes and seeds under the new
set-up. For every row, mode and length both have: the paired difference to the baseline in the
old table, the same in the new runs, and the change (new − old), paired by the seeds both have,
with its 95% t interval. The two sets are never merged into one table (compare.py refuses two
vocabularies in one); the change says how far a reading of the old table carries to the new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.report.budget import interval_text
from poslab.report.intervals import Interval, holm, paired_difference, t_interval

Key = tuple[str, str, int]  # (row, mode, length)


def per_seed_differences(rows: list[dict], baseline: str) -> dict[Key, dict[str, float]]:
    """(row, mode, length) -> {seed: row's ppl − the baseline's}, over the seeds both kept."""
    ppl = {
        (r["scheme"], r["mode"], r["length"]): (r.get("per_seed") or {}).get("ppl") or {}
        for r in rows
        if r.get("status") == "ok"
    }
    found = {}
    for (scheme, mode, length), mine in ppl.items():
        theirs = ppl.get((baseline, mode, length))
        if scheme == baseline or not theirs:
            continue
        shared = {s: mine[s] - theirs[s] for s in mine if s in theirs}
        if shared:
            found[scheme, mode, length] = shared
    return found


def vocabulary_change(
    old_table: Path, new_paths: list[str | Path], baseline: str, out: Path, title: str
) -> list[dict[str, Any]]:
    """Write DIR/change.{md,json}; returns the records."""
    from poslab.report.compare import compare
    from poslab.report.files import text_file, write_all_or_none

    try:
        old_rows = json.loads(Path(old_table).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{old_table}: not a comparison.json ({err})") from None
    check_writable(out, "--out")
    new_rows = compare(new_paths, out / "new", title=f"{title}: the new set-up", baseline=baseline)
    old, new = (per_seed_differences(rows, baseline) for rows in (old_rows, new_rows))
    keys = [k for k in old if k in new]
    if not keys:
        raise ConfigError(
            f"the old table and the new runs share no row, mode and length with per-seed values "
            f"and a {baseline} row; pass a comparison.json that kept per_seed, and runs of the "
            "same schemes"
        )
    changes: dict[Key, Interval | None] = {k: paired_difference(new[k], old[k]) for k in keys}
    family = [k for k in keys if changes[k] is not None and changes[k].p is not None]
    adjusted = dict(zip(family, holm([changes[k].p for k in family]), strict=True))
    lines = [
        f"## {title}\n",
        f"Each row minus {baseline}, paired by seed, in the old table ({old_table}) and in the new "
        "runs, and the change (new − old) paired by the seeds both have; Holm over the "
        f"{len(family)} changes with an interval.\n",
        "| row | mode | length | old − base | new − base | change | Holm p |",
        "|---|---|---:|---|---|---|---:|",
    ]
    records = _lines_and_records(keys, old, new, changes, adjusted, lines)
    write_all_or_none(
        {
            out / "change.md": text_file("\n".join(lines) + "\n"),
            out / "change.json": text_file(json.dumps(records, indent=1)),
        }
    )
    print("\n".join(lines), flush=True)
    return records


def _lines_and_records(
    keys: list[Key],
    old: dict[Key, dict[str, float]],
    new: dict[Key, dict[str, float]],
    changes: dict[Key, Interval | None],
    adjusted: dict[Key, float],
    lines: list[str],
) -> list[dict[str, Any]]:
    """The table's lines (appended to `lines`) and the JSON records, one per key."""
    records = []
    for k in keys:
        before, after = t_interval(list(old[k].values())), t_interval(list(new[k].values()))
        p = adjusted.get(k)
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]:,} | {interval_text(before, 2, True)} | "
            f"{interval_text(after, 2, True)} | {interval_text(changes[k], 2, True)} | "
            f"{'—' if p is None else f'{p:.3f}'} |"
        )
        records.append(
            {
                "scheme": k[0],
                "mode": k[1],
                "length": k[2],
                "old": _as_dict(before),
                "new": _as_dict(after),
                "change": _as_dict(changes[k]),
                "holm_p": p,
                "seeds": sorted(set(old[k]) & set(new[k])),
            }
        )
    return records


def _as_dict(i: Interval | None) -> dict[str, Any] | None:
    return None if i is None else {"mean": i.mean, "low": i.low, "high": i.high, "n": i.n}


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="scripts/vocabulary_change.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("old", help="a committed comparison.json (rows with per_seed)")
    parser.add_argument("new", nargs="+", help="the new runs, or a committed folder of them")
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--baseline", required=True, help="the row every difference is taken to, e.g. rope"
    )
    parser.add_argument("--title", default="version 1 against version 2")
    args = parser.parse_args(argv)
    vocabulary_change(Path(args.old), args.new, args.baseline, Path(args.out), args.title)
