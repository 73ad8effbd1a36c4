"""Result rows as Markdown tables: one row per scheme (or mode), one column per evaluation length.

Row statuses: "ok"; "skipped: <reason>" (a length the scheme cannot represent, or that no
document of eval.documents reaches: a "—" cell); "nonfinite" (the model diverged: loss/ppl are
NaN or inf: a "nonfinite" cell). A row of an older file that says "ok" but holds a non-finite
value is treated as "nonfinite".
"""

from __future__ import annotations

import math

from poslab.report.learning import examples_per_seed, judged, learning_cells

NONFINITE = "nonfinite"  # the cell of a diverged model (NaN or inf), never "—" (a skipped length)
NO_DOCUMENT = "skipped: no document"  # the status of a length no document reaches (documents.py)


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


# metrics whose differences live in the third decimal (context_use.py: nats and shares)
FINE_DIGITS = {"context_gain": 3, "key_token_share": 3}


def cell(row: dict | None, value: str) -> str:
    """One Markdown cell: "—" for a length not evaluated or skipped, "nonfinite" for a diverged
    model, else the number."""
    if row is None or str(row.get("status", "")).startswith("skipped"):
        return "—"
    if is_nonfinite(row, value):
        return NONFINITE
    if row.get("status") != "ok":
        return str(row.get("status"))
    digits = FINE_DIGITS.get(value, 2)
    text = fmt(row.get(value), digits)
    if row.get("n_seeds", 1) > 1 and is_finite(row.get(f"{value}_sd")):
        text += f" ± {fmt(row[f'{value}_sd'], digits)}"
    if value == "accuracy":
        text += wilson_text(row)
    return text


def examples_scored(row: dict) -> int | None:
    """The examples behind a row's accuracy, over all its seeds (each seed scores `examples`)."""
    if is_finite(row.get("examples_pooled")):
        return int(row["examples_pooled"])
    if is_finite(row.get("examples")):
        return int(row["examples"]) * int(row.get("n_seeds", 1))
    return None


def wilson_text(row: dict) -> str:
    """The 95% Wilson interval of an accuracy over the examples scored (pooled over seeds), as
    " [0.81, 0.93]"; "" for a row without an example count (the baseline rows)."""
    from poslab.report.intervals import wilson_interval

    n = examples_scored(row)
    if not is_finite(row.get("accuracy")) or not n:
        return ""
    low, high = wilson_interval(row["accuracy"] * n, n)
    return f" [{low:.2f}, {high:.2f}]"


def seeds_note(rows: list[dict]) -> str:
    """How many seeds the rows' cells stand for: "mean ± sample sd over 3 seeds" or "one seed
    per row (no spread)"."""
    counts = sorted({r.get("n_seeds", 1) for r in rows})
    if counts == [1]:
        return "One seed per row (no spread)."
    merged = {r["scheme"] for r in rows if r.get("n_seeds", 1) > 1}
    n = "/".join(str(c) for c in counts if c > 1)
    if len(merged) < len({r["scheme"] for r in rows}):
        # a row's name may hold a comma ("nope, stick-breaking"): then the names are listed
        # with semicolons, so that no one reads "nope" as a merged row
        sep = "; " if any("," in name for name in merged) else ", "
        return (
            f"Rows merged over seeds ({sep.join(sorted(merged))}) show mean ± sample sd over "
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


def markdown(rows: list[dict], title: str, row_key: str, brief: bool = False) -> str:
    """Tables of token perplexity and the tokenizer-independent metric; with row_key="scheme"
    one pair of tables per mode (a comparison), with row_key="mode" one pair (a single run).
    `brief` (the console): the second table only where it says something else (word-level
    perplexity of a word-level vocabulary is the token perplexity)."""
    r0 = rows[0]
    scored = scored_note(rows)
    source = r0.get("documents_source")  # eval.documents: no split, documents
    read = f"documents of {source}" if source else f"{r0['split']} split"
    parts = [f"## {title}", f"\n{read}{scored}, trained at L={r0['train_length']}."]
    legend = []
    skipped = [str(r["status"]) for r in rows if str(r["status"]).startswith("skipped")]
    if any(not status.startswith(NO_DOCUMENT) for status in skipped):
        legend.append("— = a length the scheme cannot represent (skipped)")
    if any(status.startswith(NO_DOCUMENT) for status in skipped):
        legend.append("— = a length no document reaches (skipped)")
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
        parts += [f"\n### token perplexity ({name})\n", markdown_table(sub, "ppl", row_key)]
        if brief and all(r.get(other) == r.get("ppl") for r in sub):
            parts[-2] = f"\n### token perplexity = {other.replace('_', ' ')} ({name})\n"
            continue
        parts += [
            f"\n### {other.replace('_', ' ')} ({name})\n",
            markdown_table(sub, other, row_key),
        ]
    parts += context_use_tables(rows, row_key)
    return "\n".join(parts)


def context_use_tables(rows: list[dict], row_key: str) -> list[str]:
    """The context-use tables of a report (eval.short_context, context_use.py), [] without."""
    parts: list[str] = []
    used = [r for r in rows if "context_gain" in r]  # eval.short_context (context_use.py)
    if used:
        shorts = list(dict.fromkeys(r["short_context"] for r in used))
        threshold = used[0]["gain_threshold"]
        over = f"a {shorts[0]}-token context"
        if len(shorts) > 1:
            named = [
                f"{c} for "
                + ", ".join(dict.fromkeys(r[row_key] for r in used if r["short_context"] == c))
                for c in shorts
            ]
            over = f"each row's short context (c = {'; '.join(named)}: not comparable gains)"
        parts += [
            f"\n### context use: mean gain over {over} (nats; nonoverlapping)\n",
            markdown_table(used, "context_gain", row_key),
            f"\n### key tokens: share gaining > {threshold:g} nats from the long context\n",
            markdown_table(used, "key_token_share", row_key),
        ]
    return parts


def scored_note(rows: list[dict]) -> str:
    """What was scored, for a report's first line: tokens (and the cap that chose them),
    precision, and the sliding stride (empty for rows written before these were recorded, and
    for tasks, which say their examples in their own tables)."""
    text = [r for r in rows if r.get("status") == "ok" and "accuracy" not in r and "tokens" in r]
    if not text:
        return ""
    notes = []
    documents = sorted({int(r["documents"]) for r in text if "documents" in r})
    if documents:  # each its first L tokens: the count falls as L grows past shorter documents
        counted = "–".join(f"{n:,}" for n in dict.fromkeys([documents[0], documents[-1]]))
        notes.append(f"{counted} documents per length, each scored on its first L tokens")
    tokens = sorted({int(r["tokens"]) for r in text})
    if len(tokens) == 1:
        notes.append(f"{tokens[0]:,} tokens scored")
    else:
        notes.append(f"{tokens[0]:,}–{tokens[-1]:,} tokens scored")
    caps = {r.get("max_tokens", "unknown") for r in text}
    if caps != {"unknown"}:
        capped = sorted(c for c in caps if isinstance(c, int))
        if capped:
            notes.append(f"capped at {', '.join(f'{c:,}' for c in capped)} (eval.max_tokens)")
        if None in caps:
            notes.append("the whole split" if not capped else "or the whole split")
        if "unknown" in caps:  # older rows of a merged table did not record it
            notes[-1] += " where recorded"
    precisions = sorted({str(r["precision"]) for r in text if r.get("precision")})
    if precisions:
        partly = any(not r.get("precision") for r in text)
        notes.append(f"precision {', '.join(precisions)}" + (" where recorded" if partly else ""))
    sliding = [r for r in text if r.get("mode") == "sliding" and "stride" in r]
    strides = sorted({int(r["stride"]) for r in sliding})
    if sliding and all(int(r["stride"]) == max(1, r["length"] // 2) for r in sliding):
        notes.append("sliding stride L/2")
    elif strides:
        notes.append(f"sliding stride {', '.join(map(str, strides))}")
    # data_path= asked for a text other than the run's (evaluation/run.py check_scored_text)
    notes += sorted({r["other_text"] for r in text if r.get("other_text")})
    return " (" + "; ".join(notes) + ")"


def is_task(rows: list[dict]) -> bool:
    """Rows of a generated task's evaluation (accuracy), not of a corpus (perplexity)."""
    return any("accuracy" in r for r in rows)


def task_tables(rows: list[dict], name: str, row_key: str) -> list[str]:
    """The Markdown parts of a task's rows: whether each run learned the task at L and its
    effective length; exact-match and token accuracy with two baseline rows (chance, the best
    stated shortcut); answer perplexity. A row that did not learn at L says so in its label."""
    threshold = next((r["learned_at"] for r in rows if is_finite(r.get("learned_at"))), None)
    shown = [{**r, row_key: learning_label(r, row_key)} for r in rows]
    baselines = baseline_rows(rows, row_key)
    parts = []
    if threshold is not None:
        parts += [
            f"\n### learned at L, effective length ({name})\n",
            f"A run learned the task when its accuracy at L reaches {threshold:g}; its effective "
            f"length is the longest evaluated length up to which accuracy stays ≥ {threshold:g} "
            "(0: not learned). Steps to learn: the step whose validation accuracy first "
            "reached `train.stop_at_accuracy` (over the seeds that reached it). With the "
            "uncertainty of the examples: each seed's accuracy at L with its 95% Wilson "
            "interval over that seed's examples, and a verdict, learned (✓) when the lower bound "
            f"is ≥ {threshold:g}, not learned (✗) when the upper bound is below it, unclear (?) "
            f"when the interval holds {threshold:g}; each seed's effective length as "
            "sure–possible: the longest length up to which every length is learned by the "
            "lower bound, and up to which none is not learned by the upper bound. Only rows "
            "whose every seed is learned by the lower bound are ranked (by effective length).\n",
            learning_table(rows, row_key),
        ]
    if threshold is None and any(is_finite(r.get("accuracy")) for r in rows):
        parts += pooled_verdicts(rows, name, row_key)
    return [
        *parts,
        f"\n### accuracy: the whole answer right ({name})\n",
        "Cells: accuracy (± sd over seeds where merged) [95% Wilson interval over the examples "
        "scored, pooled over seeds: the uncertainty from the number of examples, not from "
        "seeds].\n",
        markdown_table(shown + baselines, "accuracy", row_key),
        f"\n### token accuracy: answer tokens right ({name})\n",
        markdown_table(shown + baselines, "token_accuracy", row_key),
        f"\n### answer perplexity ({name})\n",
        markdown_table(shown, "ppl", row_key),
        baselines_note(rows),
    ]


def did_not_learn(row: dict) -> bool:
    """A run (or any seed of a merged row) whose accuracy at L stayed below eval.learned_at."""
    return row.get("learned") is False


def learning_note(row: dict) -> str | None:
    """What a label says of a row not judged beyond L: "did not learn at L" when no seed did,
    "learned at L in k/n seeds" when some did (a merged row counts as learned only when every
    seed did); None for a row that learned, or that was never judged. Where the row at L kept
    each seed's accuracy and example count, k counts the seeds learned by their Wilson interval
    (report/learning.py) and the seeds it cannot tell are named "unclear"."""
    if not did_not_learn(row):
        return None
    n, k = row.get("n_seeds", 1), row.get("learned_seeds", 0)
    if row.get("length") == row.get("train_length"):
        from poslab.report.learning import UNCLEAR, VERDICT_YES, seed_accuracies

        line = row["learned_at"] if is_finite(row.get("learned_at")) else 0.9
        said = [a.verdict for a in seed_accuracies(row, line).values() if a.verdict]
        if said and len(said) == n:
            yes, unclear = said.count(VERDICT_YES), said.count(UNCLEAR)
            if yes == 0 and unclear == 0:
                return "did not learn at L"
            told = f"learned at L in {yes}/{n} seeds"
            return told + (f", {unclear} unclear" if unclear else "")
    return f"learned at L in {k}/{n} seeds" if n > 1 and 0 < k < n else "did not learn at L"


def learning_label(row: dict, row_key: str) -> str:
    label, note = str(row[row_key]), learning_note(row)
    return f"{label} ({note})" if note else label


def baseline_rows(rows: list[dict], row_key: str) -> list[dict]:
    """Per length: "chance" (a uniform guess) and "best shortcut" (the best of the task's stated
    trivial heuristics on the same examples, averaged over seeds), as table rows."""
    out = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        if is_finite(r.get("chance")):
            out.append(
                {
                    row_key: "_chance_",
                    "length": r["length"],
                    "status": "ok",
                    "accuracy": r["chance"],
                    "token_accuracy": r.get("token_chance"),
                }
            )
        if is_finite(r.get("shortcut")):
            out.append(
                {
                    row_key: "_best shortcut_",
                    "length": r["length"],
                    "status": "ok",
                    "accuracy": r["shortcut"],
                    "token_accuracy": r.get("shortcut_token"),
                }
            )
    best: dict[tuple, dict] = {}  # one baseline cell per (row, length): the highest
    for b in out:
        key = (b[row_key], b["length"])
        if key not in best or b["accuracy"] > best[key]["accuracy"]:
            best[key] = b
    return list(best.values())


def baselines_note(rows: list[dict]) -> str:
    names = sorted({r["shortcut_name"] for r in rows if r.get("shortcut_name")})
    note = "\n_chance_: a uniform guess at every answer token."
    if names:
        note += (
            " _best shortcut_: the best of the task's stated trivial heuristics on the same "
            f"examples (here: {', '.join(names)})."
        )
    return note


def pooled_verdicts(rows: list[dict], name: str, row_key: str, line: float = 0.9) -> list[str]:
    """For rows that recorded no learning threshold (tables made before eval.learned_at was kept,
    hence without per-seed accuracies): each row's accuracy at L judged by the Wilson interval
    over its examples pooled over seeds, against the default line."""
    at_l = [r for r in rows if r.get("factor") == 1.0 and r.get("status") == "ok"]
    lines = [
        f"\n### learned at L, judged by the interval ({name})\n",
        f"This table recorded no learning threshold nor each seed's accuracy, so each row's "
        f"accuracy at L (the mean over its seeds) is judged on the examples of all its seeds "
        f"pooled, against {line:g}: learned (✓) when the 95% Wilson interval's lower bound "
        f"is ≥ {line:g}, not learned (✗) when its upper bound is below, unclear (?) between. "
        "Learned here says the seeds' mean is above the line, not that every seed is.\n",
        f"| {row_key} | seeds | accuracy at L [95% Wilson, pooled] | verdict |",
        "|---|---|---|---|",
    ]
    for r in at_l:
        n = r.get("n_seeds", 1)
        per_seed = examples_per_seed(r)
        seen = judged(r["accuracy"], per_seed * n if per_seed else None, line)
        lines.append(f"| {r[row_key]} | {n} | {seen.text()} | {seen.verdict or '—'} |")
    return [*lines[:3], "\n".join(lines[3:])]


def learning_table(rows: list[dict], row_key: str) -> str:
    """One line per row key: learned at L (seeds at or above the line / seeds), each seed's
    accuracy at L with its 95% Wilson interval and the verdict counts (report/learning.py),
    effective length (mean ± sd over seeds) and each seed's sure–possible effective length,
    steps to learn, and a rank by effective length among the rows whose every seed learned by
    its interval's lower bound ("—" for the others: a run not surely learned is never ranked;
    a row without an example count, hence no verdict, by its accuracy alone)."""
    line = next((r["learned_at"] for r in rows if is_finite(r.get("learned_at"))), 0.9)
    by_key: dict[str, list[dict]] = {}
    for r in rows:
        by_key.setdefault(r[row_key], []).append(r)
    first = {key: group[0] for key, group in by_key.items()}
    cells = {key: learning_cells(group, line) for key, group in by_key.items()}
    # ranked: every seed reached the line, and none is unclear or not learned by its interval
    # (a row without an example count has no verdict: None, ranked by its accuracy alone)
    surely = [k for k, r in first.items() if r.get("learned") is True]
    surely = [k for k in surely if cells[k].every_seed_sure is not False]
    ranked = sorted(surely, key=lambda k: -first[k].get("effective_length", 0))
    rank, previous = {}, None
    for i, key in enumerate(ranked):  # ties share a rank
        value = first[key].get("effective_length")
        rank[key] = (
            rank[previous]
            if previous and first[previous].get("effective_length") == value
            else i + 1
        )
        previous = key
    lines = [
        f"| {row_key} | learned at L | accuracy at L by seed [95% Wilson] | verdict at L "
        "| effective length | by seed, sure–possible | steps to learn | rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in first.items():
        n = r.get("n_seeds", 1)
        passed = r.get("learned")
        seeds_passed = r.get("learned_seeds", int(bool(passed)))
        said = (
            f"{seeds_passed}/{n}"
            if n > 1
            else {True: "yes", False: "no", None: "not evaluated"}[passed]
        )
        c = cells[key]
        effective, steps = whole(r, "effective_length"), whole(r, "steps_to_learn")
        lines.append(
            f"| {key} | {said} | {c.accuracies} | {c.verdicts} | {effective} | {c.spans} "
            f"| {steps} | {rank.get(key, '—')} |"
        )
    return "\n".join(lines)


def whole(row: dict, key: str) -> str:
    """A count (tokens, steps) as a whole number, ± its sd over seeds where there is one."""
    value, sd = row.get(key), row.get(f"{key}_sd")
    if not is_finite(value):
        return "—"
    spread = f" ± {sd:,.0f}" if row.get("n_seeds", 1) > 1 and is_finite(sd) else ""
    return f"{value:,.0f}{spread}"
