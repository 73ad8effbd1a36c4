"""Merge the extrapolation results of several runs into one table and plot (rows = schemes,
columns = eval lengths, as in the ALiBi paper), plus a check of the paper's qualitative shape."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.evaluation.tables import fmt, is_finite, is_nonfinite, markdown

# poslab.evaluation.files and .seeds (matplotlib) are imported where they are used: the
# command-line helpers below serve scripts whose bad arguments should not wait for them

log = logging.getLogger(__name__)
RESULT = "extrapolation/extrapolation.json"
WHAT_TO_PASS = (
    f"pass run folders (each with {RESULT}), sweep folders holding such runs, or "
    f"{Path(RESULT).name} files"
)
# A scheme "learned" when its perplexity at 1× is below this fraction of the vocabulary size,
# the perplexity of a uniform guess. Above that line a model has learned next to nothing; near
# it (or diverged) it is flat at every length because it predicts nothing, so its ratios say
# nothing about positions.
LEARNED_BELOW_UNIFORM = 0.5


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


# options that never change what a run learns (names, logging, caches, bookkeeping): two runs
# that differ only in these and in `seed` are seeds of one configuration
NOT_SETTINGS = (
    "run_name",
    "logger.",
    "data.cache_dir",
    "data.num_workers",
    "data.eval_batch_size",
    "checkpoint.",
    "resume",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "trainer.val_check_interval",
    "eval.log_wandb",
    "eval.batch_size",
    "eval.device",
    "train.fingerprints",
    "train.validate_before_fit",
)

# options added after some committed runs were made, each with the value that does what those
# runs did: a run whose config predates the option ran with this value, so it still merges with
# newer seeds of its configuration (a newer run with another value stays apart)
ADDED_LATER = {
    "pos.position_dtype": "fp32",
    "pos.theta_param": "raw",
    "eval.logn_scaling": False,
    "eval.rope_scaling.kind": "none",
    "eval.rope_scaling.factor": "auto",
    "eval.rope_scaling.beta_fast": 32,
    "eval.rope_scaling.beta_slow": 1,
    "eval.rope_scaling.leaky": None,
    "eval.rope_scaling.window": None,
    "eval.task_examples": 100,
}


def run_options(run: Path) -> dict[str, Any] | None:
    """The training run's options that can change its result (flattened, from Hydra's
    .hydra/config.yaml; NOT_SETTINGS left out), or None for a folder that is not a training run
    (an eval.py out_dir)."""
    path = run / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    def flat(node: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(node, dict):
            return {
                k: v
                for key, value in node.items()
                for k, v in flat(value, f"{prefix}{key}.").items()
            }
        return {prefix[:-1]: node}

    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # an unreadable config only loses the nicer label
        return None
    return {k: v for k, v in flat(config).items() if not k.startswith(NOT_SETTINGS)}


def label_rows(results: list[Path], for_report: bool = False) -> list[dict]:
    """All rows, with `scheme` made unique per configuration when two runs share a scheme name:
    by the training options in which those runs differ (`rope [pos.base=100]`), else by run
    folder (sweep/folder where two sweeps' jobs share a folder name). Runs that differ only in
    `seed` are one configuration: merged into mean ± sd rows (poslab.evaluation.seeds).
    `for_report`: every row is checked for what the report reads too (read_result)."""
    runs = [path.parent.parent for path in results]
    folder_names = [r.name for r in runs]
    folders = [
        r.name if folder_names.count(r.name) == 1 else f"{r.parent.name}/{r.name}" for r in runs
    ]
    rows_of = [read_result(path, for_report) for path in results]
    # runs of one scheme on different tasks are not twins: their rows never share a table
    schemes = [(rows[0]["scheme"], rows[0].get("task")) if rows else None for rows in rows_of]
    labels: list[str | None] = [None] * len(runs)
    seeds: list[Any] = [None] * len(runs)
    for scheme in {s for s in schemes if s is not None and schemes.count(s) > 1}:
        twins = [i for i, s in enumerate(schemes) if s == scheme]
        # a run without a config (an eval.py out_dir) is labelled by its folder; the others
        # are compared by their options
        options = [run_options(runs[i]) for i in twins]
        keys = sorted({k for o in options if o is not None for k in o})
        options = [
            None if o is None else {k: o.get(k, ADDED_LATER.get(k)) for k in keys} for o in options
        ]
        differ = [k for k in keys if len({repr(o[k]) for o in options if o is not None}) > 1]
        shown = [k for k in differ if k != "seed"]
        for i, opts in zip(twins, options, strict=True):
            if opts is None or not differ:
                labels[i] = folders[i]
                continue
            labels[i] = ", ".join(f"{k}={opts[k]}" for k in shown)
            seeds[i] = opts["seed"] if "seed" in differ else None
        # one label for several runs is fine only when their seeds tell them apart
        for label in {labels[i] for i in twins}:
            group = [i for i in twins if labels[i] == label]
            if len(group) > 1 and len({repr(seeds[i]) for i in group}) < len(group):
                for i in twins:
                    labels[i], seeds[i] = folders[i], None
                break
    configurations: dict[str, list[tuple[Any, list[dict]]]] = {}
    for label, seed, rows in zip(labels, seeds, rows_of, strict=True):
        if rows:
            name = f"{rows[0]['scheme']} [{label}]" if label else rows[0]["scheme"]
            configurations.setdefault((name, rows[0].get("task")), []).append((seed, rows))
    from poslab.evaluation.seeds import merge_seeds

    merged = []
    for (name, _), members in configurations.items():
        if len(members) > 1:
            merged += merge_seeds(sorted(members, key=lambda m: (len(str(m[0])), str(m[0]))), name)
        else:
            merged += [{**r, "scheme": name} for r in members[0][1]]
    return merged


# the fields every row needs; the report (tables, plots, shape checks) needs REPORT_FIELDS too
ROW_FIELDS = ("scheme", "mode", "length", "status")
REPORT_FIELDS = ("train_length", "split", "factor")
# fields that, where a row has them, the report formats or plots as numbers
NUMBER_FIELDS = (
    "factor",
    "loss",
    "ppl",
    "word_ppl",
    "bits_per_byte",
    "accuracy",
    "token_accuracy",
    "ratio",
    "loss_sd",
    "ppl_sd",
    "word_ppl_sd",
    "bits_per_byte_sd",
    "ratio_sd",
)


def row_problem(row: Any, fields: tuple[str, ...]) -> str | None:
    """What is wrong with one result row (a hand-edited or truncated file), else None."""
    if not isinstance(row, dict):
        return f"is {type(row).__name__} {row!r:.40}, not an object of fields"
    missing = [k for k in fields if k not in row]
    if missing:
        return f"has no {missing[0]!r} field"
    for key in ("scheme", "mode", "status"):
        if not isinstance(row[key], str):
            return f"has {key}={row[key]!r}, not a string"
    for key in ("length", "train_length"):
        value = row.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"has {key}={value!r}, not a whole number of tokens ≥ 1"
    for key in NUMBER_FIELDS:
        value = row.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"has {key}={value!r}, not a number"
    buckets = row.get("loss_by_position")
    if buckets is not None and not (
        isinstance(buckets, list)
        and all(isinstance(b, list) and len(b) == 3 for b in buckets)
        and all(isinstance(x, int | float) or x is None for b in buckets for x in b)
    ):
        return "has a loss_by_position that is not a list of [position, loss, count]"
    return None


def read_result(path: Path, for_report: bool = False) -> list[dict]:
    """The rows of one results file; a file that is not one, or a row without the fields (and
    types) the comparison reads (`for_report`: the report's too), is a ConfigError naming the
    file and the row."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} is not a results file ({err}); {WHAT_TO_PASS}") from None
    # not a list of rows at all (another JSON file): say so, not which field is missing
    if not isinstance(rows, list) or (
        rows and not any(isinstance(r, dict) and {"scheme", "mode"} <= r.keys() for r in rows)
    ):
        raise ConfigError(f"{path} is not a results file (no result rows); {WHAT_TO_PASS}")
    fields = ROW_FIELDS + REPORT_FIELDS if for_report else ROW_FIELDS
    for i, row in enumerate(rows):
        problem = row_problem(row, fields)
        if problem:
            scheme = f" ({row.get('scheme')}, {row.get('mode')})" if isinstance(row, dict) else ""
            raise ConfigError(
                f"{path}: row {i + 1} of {len(rows)}{scheme} {problem}; fix or delete that row, "
                "or evaluate the run again (eval.py)"
            )
    return rows


def ratio(rows: list[dict], scheme: str, mode: str, factor: float) -> float | None:
    """ppl at `factor`× the training length over ppl at 1×, for one scheme (None if missing or
    non-finite); for rows merged over seeds, the mean of the seeds' own ratios."""

    merged = [
        r.get("ratio")
        for r in rows
        if r["scheme"] == scheme
        and r["mode"] == mode
        and r.get("factor") == factor
        and r.get("n_seeds", 1) > 1
    ]
    if merged and is_finite(merged[0]):
        return merged[0]
    at = {
        r["factor"]: r["ppl"]
        for r in rows
        if r["scheme"] == scheme
        and r["mode"] == mode
        and r["status"] == "ok"
        and not is_nonfinite(r)
        and is_finite(r.get("ppl"))
    }
    if 1.0 not in at or factor not in at or at[1.0] <= 0:
        return None
    return at[factor] / at[1.0]


def ratio_spread(rows: list[dict], scheme: str, mode: str, factor: float) -> float | None:
    """The sd over seeds of `scheme`'s ratio at `factor`× (rows merged over seeds), else None."""
    for r in rows:
        if (r["scheme"], r["mode"], r.get("factor")) == (scheme, mode, factor):
            return r.get("ratio_sd") if r.get("n_seeds", 1) > 1 else None
    return None


def not_learned(rows: list[dict], scheme: str, mode: str, factor: float) -> str | None:
    """Why `scheme` says nothing about the shape at `factor`× (it diverged, or its perplexity at
    1× is no better than a uniform guess over the vocabulary), else None. None as well when it
    was not evaluated at 1× and `factor`× (then there is no check at all)."""

    at = {r["factor"]: r for r in rows if r["scheme"] == scheme and r["mode"] == mode}
    one, far = at.get(1.0), at.get(factor)
    if one is None or far is None or any(r["status"].startswith("skipped") for r in (one, far)):
        return None
    f = f"{factor:g}×"
    if is_nonfinite(one):
        return f"{scheme} did not learn: nonfinite loss at 1× (L={one['length']})"
    if not is_finite(one.get("ppl")):
        return f"{scheme} has no perplexity at 1× (status {one['status']})"
    vocab = one.get("vocab_size")
    if vocab and one["ppl"] >= LEARNED_BELOW_UNIFORM * vocab:
        near = "≈" if abs(one["ppl"] / vocab - 1) <= 0.1 else "is not clearly below"
        return (
            f"{scheme} did not learn: ppl {one['ppl']:.0f} at 1× {near} vocab {vocab} "
            "(a uniform guess)"
        )
    if is_nonfinite(far):
        return f"{scheme} diverged at {f}: nonfinite loss at L={far['length']}"
    if not is_finite(far.get("ppl")):
        return f"{scheme} has no perplexity at {f} (status {far['status']})"
    return None


def shape_checks(rows: list[dict], mode: str = "nonoverlapping", factor: float = 8.0) -> list[str]:
    """The ALiBi paper's shape at `factor`× the training length, one line per check: "- [x]"
    met, "- [ ]" not met, "- [n/a]" not applicable (a scheme it needs did not learn)."""

    schemes = ("sinusoidal", "rope", "alibi", "t5")
    r = {s: ratio(rows, s, mode, factor) for s in schemes}
    why = {s: not_learned(rows, s, mode, factor) for s in schemes}
    present = {s: r[s] is not None or why[s] is not None for s in schemes}
    checks: list[tuple[str, bool | None, str]] = []

    def add(text: str, needs: tuple[str, ...], ok: Any, note: Any = lambda: "") -> None:
        """`ok` (and `note`, a remark on the margin) is called only when every scheme in `needs`
        learned."""
        if not all(present[s] for s in needs):
            return
        reasons = [why[s] for s in needs if why[s]]
        if reasons:
            checks.append((text, None, "; ".join(reasons)))
        else:
            checks.append((text + note(), bool(ok()), ""))

    f = f"{factor:g}×"
    sd = {s: ratio_spread(rows, s, mode, factor) for s in schemes}

    def shown(s: str) -> str:
        return fmt(r[s]) + (f" ± {fmt(sd[s])}" if sd[s] is not None else "")

    def near(gap: float, *names: str) -> str:
        """A note when a margin is smaller than the seeds' spread of the ratios involved."""
        spread = sum(sd[s] or 0.0 for s in names)
        return "; within the spread over seeds" if spread and abs(gap) <= spread else ""

    add(
        f"sinusoidal ppl at {f} ≥ 3× its own at 1× (ratio {shown('sinusoidal')})",
        ("sinusoidal",),
        lambda: r["sinusoidal"] >= 3.0,
        lambda: near(r["sinusoidal"] - 3.0, "sinusoidal"),
    )
    add(
        f"rope ppl at {f} clearly (≥ 10%) above its own at 1× (ratio {shown('rope')})",
        ("rope",),
        lambda: r["rope"] >= 1.10,
        lambda: near(r["rope"] - 1.10, "rope"),
    )
    add(
        f"alibi ppl at {f} within 5% of, or below, its own at 1× (ratio {shown('alibi')})",
        ("alibi",),
        lambda: r["alibi"] <= 1.05,
        lambda: near(r["alibi"] - 1.05, "alibi"),
    )
    add(
        f"t5 ratio at {f} between alibi and rope ({shown('alibi')} ≤ {shown('t5')} ≤ "
        f"{shown('rope')})",
        ("t5", "rope", "alibi"),
        lambda: r["alibi"] <= r["t5"] <= r["rope"],
        lambda: (
            near(r["t5"] - r["alibi"], "t5", "alibi") or near(r["rope"] - r["t5"], "rope", "t5")
        ),
    )
    return [
        f"- [n/a] {text}: not applicable, {reason}"
        if ok is None
        else f"- [{'x' if ok else ' '}] {text}"
        for text, ok, reason in checks
    ]


def compare(paths: list[str | Path], out: str | Path, title: str | None = None) -> list[dict]:
    """Write comparison.{md,csv,json} and plots to `out`; returns the merged rows. Paths that
    do not exist or hold no results are a ConfigError (one line: which folder, what to pass)."""
    names = ", ".join(str(p) for p in paths) or "(no path given)"
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such file or folder: {', '.join(missing)}; {WHAT_TO_PASS}")
    results = find_results(paths)
    if not results:
        raise ConfigError(f"no {RESULT} under {names}; {WHAT_TO_PASS}")
    rows = label_rows(results, for_report=True)
    if not rows:
        raise ConfigError(f"the results under {names} hold no rows; {WHAT_TO_PASS}")
    out = Path(out)
    check_writable(out, "--out")
    from poslab.evaluation.files import write_reports

    # write_reports makes `out` (and removes it again if a write fails)
    tasks = {r.get("task") for r in rows}
    if title is None:  # a table of task runs is one of accuracy, named by its task(s)
        named = ", ".join(sorted(t for t in tasks if t is not None))
        title = (
            "perplexity vs evaluation length"
            if tasks == {None}
            else f"{named}: accuracy vs evaluation length"
            if None not in tasks
            else f"perplexity and {named} accuracy vs evaluation length"
        )
    text = markdown(rows, title, "scheme")
    task_modes = {r["mode"] for r in rows if r.get("task")}  # every task row names its task
    for mode in dict.fromkeys(r["mode"] for r in rows if r["mode"] not in task_modes):
        checks = shape_checks(rows, mode)
        if checks:
            text += f"\n\n### the ALiBi paper's shape ({mode}, 8× the training length)\n\n"
            text += "\n".join(checks)
    # loss by position: each scheme at its longest evaluated length, first mode only
    mode0 = rows[0]["mode"]
    longest: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["length"]):
        if r["mode"] == mode0 and r["status"] == "ok" and not is_nonfinite(r, "loss"):
            longest[r["scheme"]] = r
    write_reports(rows, out, title, "scheme", "comparison", text, list(longest.values()))
    print(text, flush=True)
    print(f"\nwrote comparison.{{md,csv,json}} and plots to {out}", flush=True)
    return rows


def default_out(paths: list[str]) -> Path:
    """<first path>/comparison (for a file: next to it)."""
    first = Path(paths[0])
    return (first.parent if first.is_file() else first) / "comparison"


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/compare.py", description=__doc__)
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders or result files")
    parser.add_argument(
        "--out",
        default=None,
        help="folder for comparison.{md,csv,json,png} (default: <first path>/comparison)",
    )
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    compare(args.paths, args.out or default_out(args.paths), args.title)
