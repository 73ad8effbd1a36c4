"""Merge the extrapolation results of several runs into one table and plot (rows = schemes,
columns = eval lengths, as in the ALiBi paper), plus a check of the paper's qualitative shape."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from poslab.evaluation.report import fmt, load_rows, markdown, write_reports

log = logging.getLogger(__name__)
RESULT = "extrapolation/extrapolation.json"


def find_results(paths: list[str | Path]) -> list[Path]:
    """extrapolation.json files of the given run folders, sweep folders or files."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / RESULT).is_file():
            found.append(p / RESULT)
        else:
            found += sorted(p.rglob(RESULT))
    return found


def label_rows(results: list[Path]) -> list[dict]:
    """All rows, with `scheme` made unique per run when two runs share a scheme name."""
    per_run = [(path.parent.parent.name, load_rows([path])) for path in results]
    names = [rows[0]["scheme"] for _, rows in per_run if rows]
    merged = []
    for run, rows in per_run:
        for r in rows:
            if names.count(r["scheme"]) > 1:
                r = {**r, "scheme": f"{r['scheme']} [{run}]"}
            merged.append(r)
    return merged


def ratio(rows: list[dict], scheme: str, mode: str, factor: float) -> float | None:
    """ppl at `factor`× the training length over ppl at 1×, for one scheme (None if missing)."""
    at = {r["factor"]: r["ppl"] for r in rows
          if r["scheme"] == scheme and r["mode"] == mode and r["status"] == "ok"}  # fmt: skip
    if 1.0 not in at or factor not in at:
        return None
    return at[factor] / at[1.0]


def shape_checks(rows: list[dict], mode: str = "nonoverlapping", factor: float = 8.0) -> list[str]:
    """The ALiBi paper's shape at `factor`× the training length, one line per check."""
    r = {s: ratio(rows, s, mode, factor) for s in ("sinusoidal", "rope", "alibi", "t5")}
    checks: list[tuple[str, bool | None]] = []

    def add(text: str, ok: bool | None) -> None:
        checks.append((text, ok))

    f = f"{factor:g}×"
    if r["sinusoidal"] is not None:
        add(f"sinusoidal ppl at {f} ≥ 3× its own at 1× (ratio {fmt(r['sinusoidal'])})",
            r["sinusoidal"] >= 3.0)  # fmt: skip
    if r["rope"] is not None:
        add(f"rope ppl at {f} clearly (≥ 10%) above its own at 1× (ratio {fmt(r['rope'])})",
            r["rope"] >= 1.10)  # fmt: skip
    if r["alibi"] is not None:
        add(f"alibi ppl at {f} within 5% of, or below, its own at 1× (ratio {fmt(r['alibi'])})",
            r["alibi"] <= 1.05)  # fmt: skip
    if None not in (r["t5"], r["rope"], r["alibi"]):
        add(f"t5 ratio at {f} between alibi and rope ({fmt(r['alibi'])} ≤ {fmt(r['t5'])} ≤ "
            f"{fmt(r['rope'])})", r["alibi"] <= r["t5"] <= r["rope"])  # fmt: skip
    return [f"- [{'x' if ok else ' '}] {text}" for text, ok in checks]


def compare(paths: list[str | Path], out: str | Path, title: str | None = None) -> list[dict]:
    """Write comparison.{md,csv,json} and plots to `out`; returns the merged rows."""
    results = find_results(paths)
    if not results:
        raise FileNotFoundError(f"no {RESULT} under {[str(p) for p in paths]}")
    rows = label_rows(results)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = title or "perplexity vs evaluation length"
    text = markdown(rows, title, "scheme")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        checks = shape_checks(rows, mode)
        if checks:
            text += f"\n\n### the ALiBi paper's shape ({mode}, 8× the training length)\n\n"
            text += "\n".join(checks)
    # loss by position: each scheme at its longest evaluated length, first mode only
    mode0 = rows[0]["mode"]
    longest: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["length"]):
        if r["mode"] == mode0 and r["status"] == "ok":
            longest[r["scheme"]] = r
    write_reports(rows, out, title, "scheme", "comparison", text, list(longest.values()))
    print(text, flush=True)
    print(f"\nwrote comparison.{{md,csv,json}} and plots to {out}", flush=True)
    return rows


class CompareOnMultirunEnd(Callback):
    """Hydra callback: after a `-m` sweep, merge its jobs' results into <sweep>/comparison/."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if find_results([sweep]):
            compare([sweep], sweep / "comparison")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders or result files")
    parser.add_argument("--out", required=True, help="folder for comparison.{md,csv,json,png}")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    compare(args.paths, args.out, args.title)
