"""Merge the extrapolation results of several runs into one table and plot (rows = schemes,
columns = eval lengths, as in the ALiBi paper), plus a check of the paper's qualitative shape."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, a_path, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.report.differences import difference, difference_set, holm_table
from poslab.report.intervals import Interval
from poslab.report.provenance import (
    caption,
    check_one_vocabulary,
    check_seeds_scored_alike,
    merged_provenance,
    provenance_of_run,
    provenance_table,
)
from poslab.report.tables import fmt, is_finite, is_nonfinite, markdown

# poslab.report.files and .seeds (matplotlib) are imported where they are used: the
# command-line helpers below serve scripts whose bad arguments should not wait for them

log = logging.getLogger(__name__)
RESULT = "extrapolation/extrapolation.json"
RESULT_FILE = Path(RESULT).name
WHAT_TO_PASS = (
    f"pass run folders (each with {RESULT}), sweep folders holding such runs, or "
    f"{Path(RESULT).name} files"
)
# A scheme "learned" when its perplexity at 1× is below this fraction of the vocabulary size,
# the perplexity of a uniform guess. Above that line a model has learned next to nothing; near
# it (or diverged) it is flat at every length because it predicts nothing, so its ratios say
# nothing about positions.
LEARNED_BELOW_UNIFORM = 0.5
# how a shape check says the seeds cannot tell (it is marked "[?]", not met or missed)
UNSETTLED = "not settled at these seeds"
NOT_DISTINGUISHABLE = "not distinguishable"


def find_results(paths: list[str | Path]) -> list[Path]:
    """extrapolation.json files of the given run folders, sweep folders or files; a folder
    eval.py wrote (`RUN/extrapolation-<time>/`, or `RUN/extrapolation/` itself) is its own
    results, a study folder (study.json) its runs' (as the study's own table: its `evals/` are
    other evaluations of the same runs, each with its table), and a folder compare.py wrote
    (comparison.json, no runs under it) that table."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / RESULT).is_file():
            found.append(p / RESULT)
        elif (p / RESULT_FILE).is_file():
            found.append(p / RESULT_FILE)
        elif (p / "study.json").is_file() and (p / "runs").is_dir():
            found += sorted((p / "runs").rglob(RESULT))
        else:
            under = sorted(p.rglob(RESULT))
            table = p / "comparison.json"
            found += under or ([table] if table.is_file() else [])
    resolved = [f.resolve() for f in found]
    twice = [f for f, r in zip(found, resolved, strict=True) if resolved.count(r) > 1]
    if twice:
        raise ConfigError(
            f"{twice[0]} is given twice (it would count as two seeds); pass each run or folder once"
        )
    return found


def results_under(paths: list[str | Path]) -> list[Path]:
    """find_results, with a ConfigError for a path that does not exist or for no results."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such file or folder: {', '.join(missing)}; {WHAT_TO_PASS}")
    results = find_results(paths)
    if not results:
        # a training run not evaluated yet (eval.after_train=false, or stopped before it)
        trained = [
            p
            for p in map(Path, paths)
            if (p / ".hydra" / "config.yaml").is_file() or (p / "checkpoints").is_dir()
        ]
        if trained:
            raise ConfigError(
                f"{trained[0]} is a training run with no evaluation yet (no {RESULT}); "
                f"evaluate it first: python eval.py run={trained[0]}"
            )
        names = ", ".join(str(p) for p in paths) or "(no path given)"
        raise ConfigError(f"no {RESULT} under {names}; {WHAT_TO_PASS}")
    return results


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
    "pos.train_length",  # t5's copy of data.seq_len (which is compared), for max_distance=auto
    # extend=: the parent's folder names where the weights came from (run.json keeps the
    # lineage); the architecture and pos.scaling it gave are in the child's config, compared
    "extend",
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
    "data.tokenizer_version": 1,  # a word vocabulary made before the record is version 1
}


def run_options(run: Path) -> dict[str, Any] | None:
    """The training run's options that can change its result (flattened, from Hydra's
    .hydra/config.yaml; NOT_SETTINGS left out), or None for a folder that is not a training run
    (an eval.py out_dir): an out_dir that recorded the run it evaluated has that run's options."""
    path = run / ".hydra" / "config.yaml"
    if not path.is_file():
        from poslab.report.files import evaluated_run

        source = evaluated_run(run)
        return run_options(source) if source is not None and source != run else None
    from omegaconf import OmegaConf

    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # an unreadable config only loses the nicer label
        return None
    return settings_of(config)


def settings_of(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config (unresolved, as .hydra/config.yaml holds it) as flat `a.b` keys, the
    options that only name things (NOT_SETTINGS) left out."""

    def flat(node: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(node, dict):
            return {
                k: v
                for key, value in node.items()
                for k, v in flat(value, f"{prefix}{key}.").items()
            }
        return {prefix[:-1]: node}

    return {k: v for k, v in flat(config).items() if not k.startswith(NOT_SETTINGS)}


# a run's options as run_options reads them (None: no config to compare), read once per run
OptionsAt = Callable[[Path], dict[str, Any] | None]
# (row label, task) -> each seed's (seed, rows) of that configuration
Configurations = dict[tuple[str, Any], list[tuple[Any, list[dict]]]]


def label_rows(
    results: list[Path],
    for_report: bool = False,
    joins: dict[str, str] | None = None,
    per_seed: list[str] | None = None,
) -> list[dict]:
    """All rows, with `scheme` made unique per configuration when two runs share a scheme name:
    by the training options in which those runs differ (`rope [pos.base=100]`), else by run
    folder (sweep/folder where two sweeps' jobs share a folder name). Runs that differ only in
    `seed` are one configuration: merged into mean ± sd rows (poslab.report.seeds). A file
    of several schemes' rows (a committed comparison.json) gives one entry per row, labelled by
    the table's folder when a run of that name stands beside it (`t5 [extrapolation_cpu_all]`).
    `for_report`: every row is checked for what the report reads too (read_result). `joins`
    ({ROW: INTO}, `--join`): the one-seed row ROW (read back from a committed table, whose
    settings cannot be compared) counts as one more seed of the configuration labelled INTO.
    `per_seed` (`--per-seed KEY`): options that differ between seeds by design (a LongRoPE
    child's factors, searched on each parent): runs that differ only in them are one
    configuration."""
    options_of: dict[Path, dict[str, Any] | None] = {}  # each run's config, read once

    def options_at(run: Path) -> dict[str, Any] | None:
        if run not in options_of:
            options = run_options(run)
            if options is not None and per_seed:
                keys = tuple(per_seed)
                options = {k: ("per seed" if k.startswith(keys) else v) for k, v in options.items()}
            options_of[run] = options
        return options_of[run]

    runs, rows_of, places = _runs_and_rows(results, for_report)
    labels, seeds = _twin_labels(runs, rows_of, options_at, places)
    joins_left = dict(joins or {})  # _configurations takes out each join it makes
    configurations, run_of, joined = _configurations(
        runs, rows_of, labels, seeds, options_at, joins_left
    )
    _check_joins(joins_left, joined, configurations)
    for key in per_seed or ():  # a key that names no option of any run: a typo, one line
        if not any(
            v == "per seed" and k.startswith(key)
            for o in options_of.values()
            if o
            for k, v in o.items()
        ):
            raise ConfigError(
                f"--per-seed {key}: no run here has an option {key!r} (or under it); pass a "
                "training option of these runs, as .hydra/config.yaml names it"
            )
    merged = _merged_rows(configurations)
    # a row read back from a committed table keeps the settings that differed when it was made:
    # the new runs give their values of those too, so that one legend compares all rows
    stored = {k for row in merged for k in row.get("settings") or {}}
    settings = differing_settings(
        {name: (run, options_at(run)) for name, run in run_of.items()}, also=stored
    )
    for row in merged:
        if settings.get(row["scheme"]):
            row["settings"] = settings[row["scheme"]]
    return merged


def _runs_and_rows(
    results: list[Path], for_report: bool
) -> tuple[list[Path], list[list[dict]], list[Path]]:
    """Each entry's run folder, rows and the folder that names it: one per results file, or one
    per row of a table of several schemes (a committed comparison.json), whose rows each stand
    on their own. An evaluation beside the run's own (`RUN/extrapolation-<time>/`) is named by
    its folder: given with the run, it is another row, not the run a second time."""
    runs: list[Path] = []
    rows_of: list[list[dict]] = []
    places: list[Path] = []
    for path in results:
        rows = read_result(path, for_report)
        schemes_in_file = list(dict.fromkeys((r["scheme"], r.get("task")) for r in rows))
        if len(schemes_in_file) == 1:  # one run: what it rests on, from its config if unrecorded
            provenance = provenance_of_run(path.parent.parent, rows)
            rows = [{**r, "provenance": r.get("provenance") or provenance} for r in rows]
        if len(schemes_in_file) > 1:
            # a table of several rows (a committed comparison.json): each row stands on its own,
            # labelled by the folder holding the table if a run of the same name is beside it
            for key in schemes_in_file:
                runs.append(path.parent)
                places.append(path.parent)
                rows_of.append([r for r in rows if (r["scheme"], r.get("task")) == key])
        else:
            runs.append(path.parent.parent)
            places.append(
                path.parent.parent if path.parent.name == "extrapolation" else path.parent
            )
            rows_of.append(rows)
    return runs, rows_of, places


def _folder_labels(runs: list[Path]) -> list[str]:
    """Each entry's folder as a label: its name, or parent/name where two runs' folders share a
    name (two sweeps' jobs), so that a label by folder always tells the runs apart."""
    folder_names = [r.name for r in dict.fromkeys(runs)]  # a table's rows share one folder
    return [
        r.name if folder_names.count(r.name) == 1 else f"{r.parent.name}/{r.name}" for r in runs
    ]


def _twin_labels(
    runs: list[Path], rows_of: list[list[dict]], options_at: OptionsAt, places: list[Path]
) -> tuple[list[str | None], list[Any]]:
    """Each entry's label (None: its scheme name is unique, no label needed) and its seed where
    the label leaves the seed out (None otherwise): only entries that share a scheme name (and
    task) need a label, so options are read only for those."""
    folders = _folder_labels(places)
    # runs of one scheme on different tasks are not twins: their rows never share a table
    schemes = [(rows[0]["scheme"], rows[0].get("task")) if rows else None for rows in rows_of]
    labels: list[str | None] = [None] * len(runs)
    seeds: list[Any] = [None] * len(runs)
    for scheme in {s for s in schemes if s is not None and schemes.count(s) > 1}:
        twins = [i for i, s in enumerate(schemes) if s == scheme]
        # a run without a config (an eval.py out_dir) is labelled by its folder; the others
        # are compared by their options
        options = [options_at(runs[i]) for i in twins]
        _label_by_options(twins, options, folders, labels, seeds)
        _disambiguate(twins, folders, labels, seeds)
    return labels, seeds


def _differing_keys(
    options: list[dict[str, Any] | None],
) -> tuple[list[dict[str, Any] | None], list[str]]:
    """The twins' options over the keys any of them has (an option a run's config predates
    filled with ADDED_LATER's value, so that it does not count as a difference), and the keys
    whose values differ between them (`seed` included)."""
    keys = sorted({k for o in options if o is not None for k in o})
    filled = [
        None if o is None else {k: o.get(k, ADDED_LATER.get(k)) for k in keys} for o in options
    ]
    differ = [k for k in keys if len({repr(o[k]) for o in filled if o is not None}) > 1]
    return filled, differ


def _label_by_options(
    twins: list[int],
    options: list[dict[str, Any] | None],
    folders: list[str],
    labels: list[str | None],
    seeds: list[Any],
) -> None:
    """Label each twin (in `labels`, `seeds`) by the options in which the twins differ, besides
    the seed (kept apart: runs that differ only in it are seeds of one configuration); by its
    folder where it has no options or no option differs."""
    options, differ = _differing_keys(options)
    shown = [k for k in differ if k != "seed"]
    for i, opts in zip(twins, options, strict=True):
        if opts is None or not differ:
            labels[i] = folders[i]
            continue
        labels[i] = ", ".join(f"{k}={opts[k]}" for k in shown)
        seeds[i] = opts["seed"] if "seed" in differ else None


def _disambiguate(
    twins: list[int], folders: list[str], labels: list[str | None], seeds: list[Any]
) -> None:
    """Label every twin by its folder where two of them share a label and a seed: one label for
    several runs is fine only when their seeds tell them apart (they are then merged)."""
    for label in {labels[i] for i in twins}:
        group = [i for i in twins if labels[i] == label]
        if len(group) > 1 and len({repr(seeds[i]) for i in group}) < len(group):
            for i in twins:
                labels[i], seeds[i] = folders[i], None
            break


def _configurations(
    runs: list[Path],
    rows_of: list[list[dict]],
    labels: list[str | None],
    seeds: list[Any],
    options_at: OptionsAt,
    joins: dict[str, str],
) -> tuple[Configurations, dict[str, Path], dict[str, list[Any]]]:
    """The entries grouped by configuration (row name and task), each with its seed; the first
    run of each row name (where its settings are read); and the seeds joined into each INTO.
    Each join made is taken out of `joins`: what is left names no row."""
    configurations: Configurations = {}
    folders: dict[tuple[str, Any], list[Path]] = {}  # each configuration's runs, for the check
    run_of: dict[str, Path] = {}  # a configuration's first run: where its settings are read
    joined: dict[str, list[Any]] = {}  # INTO -> the seeds joined into it
    for i, (label, seed, rows) in enumerate(zip(labels, seeds, rows_of, strict=True)):
        if rows:
            name = f"{rows[0]['scheme']} [{label}]" if label else rows[0]["scheme"]
            if seed is None:  # a run of its own: its seed still pairs it with other schemes
                seed = (options_at(runs[i]) or {}).get("seed")
            if name in joins:
                seed = joined_seed(name, rows)
                name = joins.pop(name)
                joined.setdefault(name, []).append(seed)
            configurations.setdefault((name, rows[0].get("task")), []).append((seed, rows))
            folders.setdefault((name, rows[0].get("task")), []).append(runs[i])
            run_of.setdefault(name, runs[i])
    for key, members in configurations.items():
        check_seeds_scored_alike(
            key[0],
            [(seed, rows, run) for (seed, rows), run in zip(members, folders[key], strict=True)],
        )
    return configurations, run_of, joined


def _check_joins(
    joins_left: dict[str, str], joined: dict[str, list[Any]], configurations: Configurations
) -> None:
    """A ConfigError for a `--join` whose ROW or INTO is no row, or that repeats a seed of the
    row it joins (the merge would count one seed twice)."""
    labels_seen = sorted({name for name, _ in configurations})
    if joins_left:
        row = next(iter(joins_left))
        raise ConfigError(
            f"--join {row!r}: no such row; join one of: " + ", ".join(map(repr, labels_seen))
        )
    for into, extra in joined.items():
        members = [m for (name, _), ms in configurations.items() if name == into for m in ms]
        if len(members) == len(extra):
            raise ConfigError(
                f"--join ...={into!r}: no such row; join into one of: "
                + ", ".join(map(repr, labels_seen))
            )
        seeds_in = [repr(seed) for seed, _ in members]
        if len(set(seeds_in)) < len(seeds_in):
            raise ConfigError(
                f"--join into {into!r}: seeds {', '.join(seeds_in)} repeat; a joined row must "
                "add a seed the row does not have"
            )


def _merged_rows(configurations: Configurations) -> list[dict]:
    """The rows of every configuration: several seeds merged into mean ± sd rows, a single
    seed's rows as they are (with its per-seed values, so that differences can pair them)."""
    from poslab.report.seeds import merge_seeds, per_seed_values

    merged = []
    for (name, _), members in configurations.items():
        if len(members) > 1:
            rows = merge_seeds(sorted(members, key=lambda m: (len(str(m[0])), str(m[0]))), name)
            given = [r["provenance"] for _, rs in members for r in rs[:1] if r.get("provenance")]
            provenance = merged_provenance(given) if given else None
            merged += [{**r, "provenance": provenance} if provenance else r for r in rows]
            continue
        seed, rows = members[0]
        kept = per_seed_values([(seed, rows)]) if seed is not None else {}
        for r in rows:  # rows read back from a comparison.json keep the per_seed they hold
            per_seed = r.get("per_seed") or kept.get((r["mode"], r["length"]))
            # a results file of several schemes (a comparison.json read back) keeps their names
            scheme = name if name != rows[0]["scheme"] else r["scheme"]
            merged.append({**r, "scheme": scheme, **({"per_seed": per_seed} if per_seed else {})})
    return merged


# training settings that differ between schemes by design (each scheme's own options), or that
# only name things: not listed as "what differs between rows"
SCHEME_KEYS = ("pos.", "pos_name", "model_name", "seed")


def differing_settings(
    run_of: dict[str, tuple[Path, dict[str, Any] | None]], also: set[str] | None = None
) -> dict[str, dict[str, Any]]:
    """row label -> the training settings (besides the scheme's own options and the seed) in
    which the rows' runs differ, `precision=auto` resolved from the run's run.json (an eval.py
    out_dir: the evaluated run's): rows that trained 150 steps never pass for rows of 500
    steps. Empty when the runs agree. `run_of`: row label -> (its first run's folder, that run's
    options as run_options reads them). `also`: keys given for every row even where these runs
    agree (the settings that rows read back from a committed table differ in)."""
    options = {}
    for name, (run, opts) in run_of.items():
        if opts is None:
            continue
        if opts.get("trainer.precision") == "auto":
            opts = {**opts, "trainer.precision": _resolved_precision(run) or "auto"}
        options[name] = {k: v for k, v in opts.items() if not k.startswith(SCHEME_KEYS)}
    if not options or (len(options) < 2 and not also):
        return {}
    keys = sorted({k for o in options.values() for k in o})
    filled = {n: {k: o.get(k, ADDED_LATER.get(k)) for k in keys} for n, o in options.items()}
    differ = [
        k for k in keys if len({repr(o[k]) for o in filled.values()}) > 1 or k in (also or ())
    ]
    return {n: {k: o[k] for k in differ} for n, o in filled.items()} if differ else {}


def _resolved_precision(run: Path) -> str | None:
    """The precision `auto` resolved to in `run` (its run.json), or in the run an eval.py
    out_dir evaluated."""
    from poslab.report.files import evaluated_run

    for folder in filter(None, (run, evaluated_run(run))):
        try:
            resolved = json.loads((folder / "run.json").read_text()).get("precision")
        except (OSError, ValueError, AttributeError):  # no file, not JSON, not an object
            continue
        if resolved:
            return str(resolved)
    return None


def settings_table(rows: list[dict]) -> str:
    """A Markdown table of what differs between the rows' runs besides the scheme (empty when
    nothing does): the legend of the labels, which stay short."""
    by_row = {r["scheme"]: r["settings"] for r in rows if r.get("settings")}
    if not by_row:
        return ""
    keys = list(dict.fromkeys(k for s in by_row.values() for k in s))
    lines = [
        "\n\n### what differs between the rows' runs (besides the scheme and the seed)\n",
        "| row | " + " | ".join(f"`{k}`" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for name, values in by_row.items():
        lines.append(f"| {name} | " + " | ".join(str(values.get(k, "—")) for k in keys) + " |")
    if any(k not in values for values in by_row.values() for k in keys):
        lines.append(
            "\n— : not recorded for that row (a row read back from a committed table keeps "
            "only the settings that differed among the rows it was made with)"
        )
    return "\n".join(lines)


# the fields every row needs; the report (tables, plots, shape checks) needs REPORT_FIELDS too
ROW_FIELDS = ("scheme", "mode", "length", "status")
REPORT_FIELDS = ("train_length", "split", "factor")
# context use (eval.short_context): numbers where a row has them
CONTEXT_FIELDS = ("context_gain", "key_token_share")
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
        if not isinstance(row[key], str) or not row[key].strip():
            return f"has {key}={row[key]!r}, not a name"
    for key in ("length", "train_length", "vocab_size", "n_seeds", "short_context"):
        value = row.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            tokens = " of tokens" if key in ("length", "train_length") else ""
            return f"has {key}={value!r}, not a whole number{tokens} ≥ 1"
    for key in (*NUMBER_FIELDS, *CONTEXT_FIELDS):
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
    return _value_problem(row)


def _value_problem(row: dict) -> str | None:
    """What is impossible in a row whose fields have the right types: a value out of its range,
    a factor that is not length ÷ train_length, a field the report reads as a mapping that is
    none (a hand edit; each once ended in a traceback or a wrong table)."""
    for key, low in (("loss", 0.0), ("bits_per_byte", 0.0), ("ppl", 1.0), ("word_ppl", 1.0)):
        value = row.get(key)  # NaN fails no comparison: a nonfinite row stays as it is
        if value is not None and value < low:
            return f"has {key}={value!r}, below {low:g}, which no {key} can be"
    for key in ("accuracy", "token_accuracy"):
        value = row.get(key)
        if value is not None and not 0 <= value <= 1:
            return f"has {key}={value!r}, not a share between 0 and 1"
    factor, length, train = row.get("factor"), row.get("length"), row.get("train_length")
    if None not in (factor, length, train) and abs(factor * train - length) > 1e-6 * length:
        return f"has factor={factor!r}, but length ÷ train_length is {length}/{train}"
    if row.get("task") is not None and not isinstance(row["task"], str):
        return f"has task={row['task']!r}, not a name"
    if "accuracy" in row and not row.get("task"):  # the report reads accuracy of task rows only
        return "has an accuracy but no task (a perplexity row has none)"
    if "context_gain" in row and "short_context" not in row:
        return "has a context_gain but no short_context (the length it was measured against)"
    for key in ("settings", "provenance", "per_seed"):
        if row.get(key) is not None and not isinstance(row[key], dict):
            return f"has a {key} that is {type(row[key]).__name__}, not a mapping"
    if not all(isinstance(v, dict) for v in (row.get("per_seed") or {}).values()):
        return "has a per_seed that is not {metric: {seed: value}}"
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
    seen: dict[tuple, int] = {}  # each cell's first row
    trained: dict[tuple, Any] = {}  # each scheme's training length
    for i, row in enumerate(rows):
        problem = row_problem(row, fields)
        if problem is None:  # two rows of one cell, or of one run's lengths
            cell = (
                row["scheme"],
                row.get("task"),
                row["mode"],
                row["length"],
                row.get("short_context"),
            )
            first = trained.setdefault((row["scheme"], row.get("task")), row.get("train_length"))
            if cell in seen:
                problem = f"repeats row {seen[cell] + 1} (length {row['length']})"
            elif first != row.get("train_length"):
                problem = (
                    f"has train_length={row.get('train_length')!r}, but an earlier row of "
                    f"{row['scheme']} has {first!r} (one run trains at one length)"
                )
            seen.setdefault(cell, i)
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


def with_ratio(rows: list[dict], row: dict, factor: float) -> dict:
    """`row` with its ratio at `factor`×: a one-seed row keeps no `ratio` field, so its own ppl
    there over its ppl at 1× (`ratio`)."""
    if "ratio" in row:
        return row
    return {**row, "ratio": ratio(rows, row["scheme"], row["mode"], factor)}


def row_at(rows: list[dict], scheme: str, mode: str, factor: float) -> dict | None:
    """`scheme`'s row at `factor`× the training length in `mode`, else None."""
    return next(
        (x for x in rows if (x["scheme"], x["mode"], x.get("factor")) == (scheme, mode, factor)),
        None,
    )


def ratio_interval(rows: list[dict], scheme: str, mode: str, factor: float) -> Interval | None:
    """`scheme`'s ratio at `factor`× with its 95% t interval over seeds: from the seeds' own
    ratios where the row kept them, else from its mean ± sd; n = 1 without spread; None when
    there is no ratio."""
    from poslab.report.intervals import t_interval, t_quantile

    value = ratio(rows, scheme, mode, factor)
    if value is None:
        return None
    x = row_at(rows, scheme, mode, factor)
    if x is not None:
        kept = (x.get("per_seed") or {}).get("ratio") or {}
        if len(kept) > 1:
            return t_interval(list(kept.values()))
        n, sd = x.get("n_seeds", 1), x.get("ratio_sd")
        if n > 1 and is_finite(sd):
            half = t_quantile(0.975, n - 1) * sd / n**0.5
            return Interval(value, value - half, value + half, n)
    return Interval(value, None, None, 1)


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


# the schemes whose shape the ALiBi paper describes, in the order of its checks
SHAPE_SCHEMES = ("sinusoidal", "rope", "alibi", "t5")
# one shape check's line as (text, mark, reason it does not apply)
ShapeCheck = tuple[str, str, str]


@dataclass(frozen=True)
class _Shape:
    """What the shape checks read of the rows in one mode at `factor`× the training length: each
    scheme's ratio, why it says nothing about the shape (it did not learn; None if it did) and
    the ratio's 95% interval. Read once, shared by every check."""

    rows: list[dict]
    mode: str
    factor: float
    ratios: dict[str, float | None]
    why: dict[str, str | None]
    interval: dict[str, Interval | None]

    @property
    def times(self) -> str:
        return f"{self.factor:g}×"

    def present(self, s: str) -> bool:
        """Whether `s` was evaluated at 1× and `factor`× (a scheme that was not has no check)."""
        return self.ratios[s] is not None or self.why[s] is not None

    def shown(self, s: str) -> str:
        """`s`'s ratio as a check's text shows it: with its interval and number of seeds."""
        i = self.interval[s]
        if i is None or i.low is None:
            return f"{fmt(self.ratios[s])}, n = 1"
        return f"{fmt(self.ratios[s])} [{fmt(i.low)}, {fmt(i.high)}], n = {i.n}"

    def near(self, line: float, name: str) -> str:
        """A note when the ratio's 95% interval holds the check's line: not settled."""
        i = self.interval[name]
        if i is None or i.low is None or not (i.low <= line <= i.high):
            return ""
        return f"; its 95% CI holds the line: {UNSETTLED}"


def _shape_of(rows: list[dict], mode: str, factor: float) -> _Shape:
    return _Shape(
        rows,
        mode,
        factor,
        ratios={s: ratio(rows, s, mode, factor) for s in SHAPE_SCHEMES},
        why={s: not_learned(rows, s, mode, factor) for s in SHAPE_SCHEMES},
        interval={s: ratio_interval(rows, s, mode, factor) for s in SHAPE_SCHEMES},
    )


def shape_checks(rows: list[dict], mode: str = "nonoverlapping", factor: float = 8.0) -> list[str]:
    """The ALiBi paper's shape at `factor`× the training length, one line per check: "- [x]"
    met, "- [ ]" not met, "- [?]" not settled (the measured value meets or misses the line, but
    its 95% interval holds the line, or an ordering rests on a difference that is not
    distinguishable: the seeds cannot tell), "- [n/a]" not applicable (a scheme it needs did
    not learn)."""
    shape = _shape_of(rows, mode, factor)
    checks = [_sinusoidal_check(shape), _rope_check(shape), _alibi_check(shape), _t5_check(shape)]
    return [
        f"- [n/a] {text}: not applicable, {reason}" if mark == "n/a" else f"- [{mark}] {text}"
        for text, mark, reason in (c for c in checks if c is not None)
    ]


def _shape_check(
    shape: _Shape,
    text: str,
    needs: tuple[str, ...],
    ok: Callable[[], bool],
    note: Callable[[], str],
) -> ShapeCheck | None:
    """One check's line; None where a scheme in `needs` was not evaluated. `ok` (and `note`, a
    remark on the margin) are called only when every scheme in `needs` learned: only then do
    the ratios they read exist. A note that says the seeds cannot tell makes it "not settled"."""
    if not all(shape.present(s) for s in needs):
        return None
    reasons = [shape.why[s] for s in needs if shape.why[s]]
    if reasons:
        return (text, "n/a", "; ".join(reasons))
    remark = note()
    unsettled = UNSETTLED in remark or NOT_DISTINGUISHABLE in remark
    return (text + remark, "?" if unsettled else "x" if ok() else " ", "")


def _sinusoidal_check(shape: _Shape) -> ShapeCheck | None:
    """Sinusoidal positions do not extrapolate: perplexity beyond L blows up."""
    return _shape_check(
        shape,
        f"sinusoidal ppl at {shape.times} ≥ 3× its own at 1× (ratio {shape.shown('sinusoidal')})",
        ("sinusoidal",),
        lambda: shape.ratios["sinusoidal"] >= 3.0,
        lambda: shape.near(3.0, "sinusoidal"),
    )


def _rope_check(shape: _Shape) -> ShapeCheck | None:
    """Rotary positions degrade beyond L, less than sinusoidal ones."""
    return _shape_check(
        shape,
        f"rope ppl at {shape.times} clearly (≥ 10%) above its own at 1× "
        f"(ratio {shape.shown('rope')})",
        ("rope",),
        lambda: shape.ratios["rope"] >= 1.10,
        lambda: shape.near(1.10, "rope"),
    )


def _alibi_check(shape: _Shape) -> ShapeCheck | None:
    """ALiBi extrapolates: perplexity beyond L stays at (or below) its own at L."""
    return _shape_check(
        shape,
        f"alibi ppl at {shape.times} within 5% of, or below, its own at 1× "
        f"(ratio {shape.shown('alibi')})",
        ("alibi",),
        lambda: shape.ratios["alibi"] <= 1.05,
        lambda: shape.near(1.05, "alibi"),
    )


def _t5_check(shape: _Shape) -> ShapeCheck | None:
    """T5's relative bias extrapolates better than rope, worse than alibi."""
    r = shape.ratios
    return _shape_check(
        shape,
        f"t5 ratio at {shape.times} between alibi and rope ({shape.shown('alibi')} ≤ "
        f"{shape.shown('t5')} ≤ {shape.shown('rope')})",
        ("t5", "rope", "alibi"),
        lambda: r["alibi"] <= r["t5"] <= r["rope"],
        lambda: _between_note(shape),
    )


def _between_note(shape: _Shape) -> str:
    """Whether t5's place between alibi and rope rests on distinguishable differences."""
    notes = []
    for low, high in (("alibi", "t5"), ("t5", "rope")):
        rows_at = {s: row_at(shape.rows, s, shape.mode, shape.factor) for s in (low, high)}
        if None in rows_at.values():
            continue
        pair = [with_ratio(shape.rows, x, shape.factor) for x in rows_at.values()]
        d = difference(pair[1], pair[0], "ratio")
        if d is not None and d.distinguishable is False:
            notes.append(f"{high} − {low} {difference_cell(d, 3)}")
    return "; " + "; ".join(notes) if notes else ""


def signed(value: float, digits: int) -> str:
    return f"{value:+,.{digits}f}".replace("-", "−")


def difference_cell(interval: Interval | None, digits: int = 2) -> str:
    """A difference as a cell: +3.10 [+1.20, +5.00]; "… not distinguishable" when the interval
    holds 0; "+3.10 (no CI)" for one seed; "—" without a difference."""
    if interval is None:
        return "—"
    if interval.low is None or interval.high is None:
        return f"{signed(interval.mean, digits)} (no CI)"
    text = (
        f"{signed(interval.mean, digits)} [{signed(interval.low, digits)}, "
        f"{signed(interval.high, digits)}]"
    )
    return text if interval.distinguishable else f"{text} {NOT_DISTINGUISHABLE}"


def differences(rows: list[dict], baseline: str, mode: str) -> str:
    """A Markdown section: each scheme's difference to the `baseline` row at every evaluated
    length (perplexity, or accuracy for a task) and in its ratio at the longest length, with a
    95% interval: paired by seed where both rows kept their seeds' values, else Welch's
    unpaired interval from mean ± sd (said per row)."""
    sub = [r for r in rows if r["mode"] == mode]
    found_set = difference_set(rows, baseline, mode)
    metric, lengths = found_set.metric, found_set.lengths
    cells = {(r["scheme"], r["length"]): r for r in sub}
    longest = max(
        (n for n in lengths if (baseline, n) in cells and cells[baseline, n].get("factor")),
        default=None,
    )
    ratio_column = metric == "ppl" and longest is not None and longest != min(lengths)
    head = f"| scheme | seeds | {' | '.join(str(n) for n in lengths)} |"
    if ratio_column:
        factor = cells[baseline, longest]["factor"]
        head += f" ratio {factor:g}× ÷ 1× |"
    else:
        factor = 1.0
    lines = [head, "|---" * (len(lengths) + 2 + ratio_column) + "|"]
    table: dict[str, list[Interval | None]] = {}  # what the Holm p below the table adjusts
    for scheme, at_lengths in found_set.by_scheme.items():
        found = table[scheme] = list(at_lengths)
        if ratio_column and (scheme, longest) in cells:
            pair = [with_ratio(sub, cells[s, longest], factor) for s in (scheme, baseline)]
            found.append(difference(*pair, "ratio"))
        elif ratio_column:
            found.append(None)
        pairing = _pairing(next(i for i in found if i is not None))
        digits = [2 if metric == "ppl" else 3] * len(lengths) + [3] * ratio_column
        texts = [difference_cell(i, d) for i, d in zip(found, digits, strict=True)]
        lines.append(f"| {scheme} | {pairing} | {' | '.join(texts)} |")
    if len(lines) == 2:  # no row has a difference to show (the baseline lacks this mode)
        return ""
    columns = [str(n) for n in lengths] + [f"ratio {factor:g}× ÷ 1×"] * ratio_column
    what = "perplexity" if metric == "ppl" else "accuracy (whole answer)"
    return (
        f"\n\n### difference to {baseline} ({mode}): {what}, mean [95% CI]\n\n"
        f'Each scheme minus {baseline} at the same length. "paired": the per-seed differences '
        "over the seeds both ran, with a Student-t interval (n − 1 degrees of freedom); "
        '"unpaired": the rows kept no per-seed values or share fewer than two seeds, so '
        "Welch's interval from their mean ± sd. A difference whose interval holds 0 is "
        '"not distinguishable" at these seeds; a one-seed row has no interval '
        '("no CI").\n\n' + "\n".join(lines) + holm_table(table, columns)
    )


def _pairing(first: Interval) -> str:
    """How a row's differences were taken, from its first one: "3 paired", "3 unpaired", "1"."""
    if first.paired and first.n > 1:
        return f"{first.n} paired"
    return f"{first.n} unpaired" if not first.paired else "1"


def context_differences(rows: list[dict], baseline: str) -> str:
    """A Markdown section: each scheme's context use (eval.short_context: mean gain, key-token
    share) minus the baseline's at every length both measured, mean [95% CI], paired by seed."""
    cells = {(r["scheme"], r["length"]): r for r in rows if "context_gain" in r}
    lengths = sorted({n for _, n in cells})
    sections = []
    for metric, what, digits in (
        ("context_gain", "mean gain from the long context (nats)", 3),
        ("key_token_share", "share of key tokens", 3),
    ):
        lines = [f"| scheme | seeds | {' | '.join(str(n) for n in lengths)} |"]
        lines.append("|---" * (len(lengths) + 2) + "|")
        table: dict[str, list[Interval | None]] = {}  # each metric's table: a family of its own
        for scheme in dict.fromkeys(s for s, _ in cells if s != baseline):
            # a gain over another short context is another quantity: never subtracted
            found = table[scheme] = [
                difference(cells[scheme, n], cells[baseline, n], metric)
                if (scheme, n) in cells
                and (baseline, n) in cells
                and cells[scheme, n].get("short_context") == cells[baseline, n].get("short_context")
                else None
                for n in lengths
            ]
            first = next((i for i in found if i is not None), None)
            if first is None:
                continue
            seeds = f"{first.n} paired" if first.paired and first.n > 1 else str(first.n)
            texts = [difference_cell(i, digits) for i in found]
            lines.append(f"| {scheme} | {seeds} | {' | '.join(texts)} |")
        if len(lines) > 2:
            sections.append(
                f"\n\n### difference to {baseline}: {what}, mean [95% CI]\n\n"
                + "\n".join(lines)
                + holm_table(table, [str(n) for n in lengths])
            )
    return "".join(sections)


def mode_differences(rows: list[dict], mode: str, base_mode: str = "nonoverlapping") -> str:
    """A Markdown section: each scheme's perplexity in `mode` minus its own in `base_mode` at
    every length both measured, mean [95% CI], paired by seed (the same runs scored two ways).
    Sliding windows give every scored token more context, non-overlapping ones mix positions
    within L with those beyond it: the interval says which of the two a gap rests on."""
    cells = {(r["scheme"], r["mode"], r["length"]): r for r in rows if not r.get("task")}
    lengths = sorted({n for _, m, n in cells if m == mode})
    lines = [f"| scheme | seeds | {' | '.join(str(n) for n in lengths)} |"]
    lines.append("|---" * (len(lengths) + 2) + "|")
    table: dict[str, list[Interval | None]] = {}
    for scheme in dict.fromkeys(s for s, m, _ in cells if m == mode):
        found = table[scheme] = [
            difference(cells[scheme, mode, n], cells[scheme, base_mode, n], "ppl")
            if (scheme, base_mode, n) in cells and (scheme, mode, n) in cells
            else None
            for n in lengths
        ]
        first = next((i for i in found if i is not None), None)
        if first is None:
            continue
        seeds = f"{first.n} paired" if first.paired and first.n > 1 else str(first.n)
        if not first.paired and first.n > 1:
            seeds = f"{first.n} unpaired"
        lines.append(f"| {scheme} | {seeds} | {' | '.join(difference_cell(i) for i in found)} |")
    if len(lines) == 2:
        return ""
    return (
        f"\n\n### {mode} minus {base_mode}: perplexity, mean [95% CI]\n\n"
        f"Each scheme's {mode} perplexity minus its own {base_mode} one at the same length, "
        "paired by seed (the same runs scored both ways). At L, a negative difference is the "
        "gain of more context per scored token; beyond L, sliding windows score only "
        "positions past L, non-overlapping ones mix them with positions within L.\n\n"
        + "\n".join(lines)
        + holm_table(table, [str(n) for n in lengths])
    )


def joined_seed(name: str, rows: list[dict]) -> Any:
    """The seed of a one-seed row read back from a table (its per_seed values name it)."""
    seeds = {seed for r in rows for seed in (r.get("per_seed") or {}).get("ppl", {})}
    if len(seeds) != 1:
        held = f"{len(seeds)} seeds" if seeds else "no per-seed values"
        raise ConfigError(
            f"--join {name!r}: the row holds {held}; only a one-seed row with its seed "
            "recorded (a comparison.json of this version) can join another as a seed"
        )
    (seed,) = seeds
    return int(seed) if seed.isdigit() else seed


def split_renames(pairs: list[str], labels: list[str]) -> dict[str, str]:
    """`--rename ROW=NAME` pairs as {ROW: NAME}. A row's label may hold "=" itself
    (`rope [pos.base=100]`), so ROW is the longest text before an "=" that is a label; where
    none is, the text before the first "=" (which the caller then reports as no such row)."""
    rename: dict[str, str] = {}
    for pair in pairs:
        cuts = [i for i, c in enumerate(pair) if c == "="]
        known = [i for i in cuts if pair[:i] in labels]
        cut = max(known) if known else cuts[0]
        row, name = pair[:cut], pair[cut + 1 :]
        if row in rename:  # the last one would win without a word
            raise ConfigError(
                f"--rename {row!r} is given twice (as {rename[row]!r} and {name!r}); rename a "
                "row once"
            )
        rename[row] = name
    return rename


def chosen_rows(
    rows: list[dict], rename: dict[str, str] | list[str], only: list[str] | None
) -> list[dict]:
    """`rows` with labels renamed (a {ROW: NAME} map, or `--rename` pairs "ROW=NAME"), then
    (with `only`) just the named rows in that order; a name that is no row is a ConfigError
    listing the rows."""
    labels = list(dict.fromkeys(r["scheme"] for r in rows))
    if isinstance(rename, list):
        rename = split_renames(rename, labels)
    for old in rename:
        if old not in labels:
            raise ConfigError(
                f"--rename {old!r}: no such row; rename one of: "
                + ", ".join(repr(x) for x in labels)
            )
    for old, new in rename.items():
        # a table's cell ends at "|", a Markdown line at a newline
        if not new.strip() or any(c in new for c in "|\n"):
            raise ConfigError(
                f"--rename {old}={new!r}: a row name needs text, without | or newline"
            )
    shown = {old: rename.get(old, old) for old in labels}
    for old, new in shown.items():
        other = next((o for o, n in shown.items() if n == new and o != old), None)
        if other is not None:  # their rows would merge into one, as if they were seeds
            raise ConfigError(
                f"--rename: rows {old!r} and {other!r} would both be shown as {new!r}; give each "
                "row its own name"
            )
    rows = [{**r, "scheme": shown[r["scheme"]]} for r in rows]
    if only is None:
        return rows
    twice = next((name for i, name in enumerate(only) if name in only[:i]), None)
    if twice is not None:
        raise ConfigError(f"--only {twice!r} is given twice; name each row once")
    labels = list(dict.fromkeys(r["scheme"] for r in rows))
    missing = [name for name in only if name not in labels]
    if missing:
        raise ConfigError(
            f"--only {missing[0]!r}: no such row (after --rename); choose from: "
            + ", ".join(repr(x) for x in labels)
        )
    return [r for name in only for r in rows if r["scheme"] == name]


def compare(
    paths: list[str | Path],
    out: str | Path,
    title: str | None = None,
    baseline: str | None = None,
    rename: dict[str, str] | list[str] | None = None,
    only: list[str] | None = None,
    joins: list[str] | None = None,
    per_seed: list[str] | None = None,
    mixed_vocabularies: bool = False,
) -> list[dict]:
    """Write comparison.{md,csv,json} and plots to `out`; returns the merged rows. With
    `baseline` (a row's scheme label) the report adds every other row's difference to it, with
    95% intervals (`differences`). `rename` maps row labels to the names shown (applied
    first); `only` keeps just those rows, in that order. Paths that do not exist or hold no
    results, or a baseline, rename or only that names no row, are a ConfigError (one line:
    which folder or name, what to pass)."""
    names = ", ".join(str(p) for p in paths) or "(no path given)"
    results = results_under(paths)
    rows = label_rows(results, True, split_joins(joins or []), per_seed)
    if not rows:
        raise ConfigError(f"the results under {names} hold no rows; {WHAT_TO_PASS}")
    rows = chosen_rows(rows, rename or {}, only)
    mixed_note = check_one_vocabulary(rows, mixed_vocabularies)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    if baseline is not None and baseline not in schemes:
        raise ConfigError(
            f"--baseline {baseline!r} is no row of these results; pass one of: "
            + ", ".join(repr(s) for s in schemes)
        )
    out = Path(out)
    check_writable(out, "--out")
    from poslab.report.files import longest_rows, write_reports

    # write_reports makes `out` (and removes it again if a write fails)
    if title is None:
        title = _default_title(rows)
    text = _report_text(rows, title, baseline) + mixed_note
    # loss by position: each scheme at its longest evaluated length, first mode only
    write_reports(
        rows,
        out,
        title,
        "scheme",
        "comparison",
        text,
        longest_rows(rows),
        baseline,
        below=caption(rows),
    )
    print(text, flush=True)
    print(f"\nwrote comparison.{{md,csv,json}} and plots to {out}", flush=True)
    return rows


def _default_title(rows: list[dict]) -> str:
    """The title of a table of these rows: a table of task runs is one of accuracy, named by its
    task(s); one of language-model runs is one of perplexity."""
    tasks = {r.get("task") for r in rows}
    named = ", ".join(sorted(t for t in tasks if t is not None))
    return (
        "perplexity vs evaluation length"
        if tasks == {None}
        else f"{named}: accuracy vs evaluation length"
        if None not in tasks
        else f"perplexity and {named} accuracy vs evaluation length"
    )


def _report_text(rows: list[dict], title: str, baseline: str | None) -> str:
    """comparison.md's text: the table, the paper's shape per perplexity mode, the differences
    to `baseline` (with one), each sliding mode against non-overlapping windows, and the legend
    of what differs between the rows' runs."""
    text = markdown(rows, title, "scheme")
    task_modes = {r["mode"] for r in rows if r.get("task")}  # every task row names its task
    for mode in dict.fromkeys(r["mode"] for r in rows if r["mode"] not in task_modes):
        checks = shape_checks(rows, mode)
        if checks:
            text += f"\n\n### the ALiBi paper's shape ({mode}, 8× the training length)\n\n"
            text += "\n".join(checks)
    if baseline is not None and {r["scheme"] for r in rows} == {baseline}:
        # a study of one scheme ends here too: said, not an empty section or an error
        text += (
            f"\n\n### difference to {baseline}\n\n{baseline} is the only row of these "
            "results: there is no other row to take a difference from.\n"
        )
    elif baseline is not None:
        for mode in dict.fromkeys(r["mode"] for r in rows):
            text += differences(rows, baseline, mode)
        text += context_differences(rows, baseline)
    for mode in dict.fromkeys(r["mode"] for r in rows if r["mode"] not in task_modes):
        if mode != "nonoverlapping":
            text += mode_differences(rows, mode)
    return text + settings_table(rows) + provenance_table(rows)


def split_joins(pairs: list[str]) -> dict[str, str]:
    """`--join ROW=INTO` pairs as {ROW: INTO}; INTO is the text after the last "=" (a label
    made of run options holds "=" itself, so ROW may too)."""
    joins = {}
    for pair in pairs:
        row, sep, into = pair.rpartition("=")
        if not sep or not row or not into:
            raise ConfigError(f"--join {pair!r}: write ROW=INTO (two row labels)")
        joins[row] = into
    return joins


def default_out(paths: list[str]) -> Path:
    """<first path>/comparison (for a file: next to it), except for a committed study (under
    docs/results/): outputs/comparison/<its name>, so that a comparison never changes committed
    files unless --out names them."""
    first = Path(paths[0])
    folder = (first.parent if first.is_file() else first).absolute()
    parts = folder.parts
    if any(parts[i : i + 2] == ("docs", "results") for i in range(len(parts) - 1)):
        return Path("outputs") / "comparison" / folder.name
    return folder / "comparison"


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="scripts/compare.py", description=__doc__)
    parser.add_argument(
        "paths", nargs="+", type=a_path, help="run folders, sweep folders or result files"
    )
    parser.add_argument(
        "--out",
        default=None,
        type=a_path,
        help="folder for comparison.{md,csv,json,png} (default: <first path>/comparison)",
    )
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--baseline",
        default=None,
        help="a row (scheme label) to which every other row's difference is given, paired by "
        "seed, with a 95%% confidence interval",
    )
    parser.add_argument(
        "--rename",
        action="append",
        default=[],
        metavar="ROW=NAME",
        help="show row ROW (its label in the table) as NAME; repeatable",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="ROW",
        help="keep only this row (its label after --rename); repeatable, kept in that order",
    )
    parser.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="ROW=INTO",
        help="count the one-seed row ROW (read back from a committed comparison.json) as one "
        "more seed of row INTO (new runs of the same settings); repeatable",
    )
    parser.add_argument(
        "--per-seed",
        action="append",
        default=[],
        metavar="KEY",
        help="a training option (or a prefix, e.g. pos.scaling.long_factor) that differs "
        "between seeds by design, such as LongRoPE factors searched on each parent: runs "
        "that differ only in it merge into one row; repeatable",
    )
    parser.add_argument(
        "--mixed-vocabularies",
        action="store_true",
        help="allow rows of different word vocabularies (data.tokenizer_version) or corpora in "
        "one table (refused by default: their perplexities are not comparable); the table "
        "then says so",
    )
    return parser


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for pair in args.rename:  # which "=" splits ROW from NAME is decided by the rows' labels
        if "=" not in pair.strip("="):
            parser.error(f"--rename {pair!r}: write ROW=NAME")
    if args.title is not None and (not args.title.strip() or "\n" in args.title):
        parser.error(f"--title {args.title!r}: a title is one line of text; or leave it out")
    out = args.out or default_out(args.paths)
    compare(
        args.paths,
        out,
        args.title,
        args.baseline,
        args.rename,
        args.only,
        args.join,
        args.per_seed,
        args.mixed_vocabularies,
    )
