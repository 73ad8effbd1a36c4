"""Result rows as Markdown tables: one row per scheme (or mode), one column per evaluation length.

Row statuses: "ok"; "skipped: <reason>" (a length the scheme cannot represent: a "—" cell);
"nonfinite" (the model diverged: loss/ppl are NaN or inf: a "nonfinite" cell). A row of an older
file that says "ok" but holds a non-finite value is treated as "nonfinite".
"""

from __future__ import annotations

import math

NONFINITE = "nonfinite"  # the cell of a diverged model (NaN or inf), never "—" (a skipped length)


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


def cell(row: dict | None, value: str) -> str:
    """One Markdown cell: "—" for a length not evaluated or skipped, "nonfinite" for a diverged
    model, else the number."""
    if row is None or str(row.get("status", "")).startswith("skipped"):
        return "—"
    if is_nonfinite(row, value):
        return NONFINITE
    if row.get("status") != "ok":
        return str(row.get("status"))
    if row.get("n_seeds", 1) > 1 and is_finite(row.get(f"{value}_sd")):
        return f"{fmt(row.get(value))} ± {fmt(row[f'{value}_sd'])}"
    return fmt(row.get(value))


def seeds_note(rows: list[dict]) -> str:
    """How many seeds the rows' cells stand for: "mean ± sample sd over 3 seeds" or "one seed
    per row (no spread)"."""
    counts = sorted({r.get("n_seeds", 1) for r in rows})
    if counts == [1]:
        return "One seed per row (no spread)."
    merged = {r["scheme"] for r in rows if r.get("n_seeds", 1) > 1}
    n = "/".join(str(c) for c in counts if c > 1)
    if len(merged) < len({r["scheme"] for r in rows}):
        return (
            f"Rows merged over seeds ({', '.join(sorted(merged))}) show mean ± sample sd over "
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


def markdown(rows: list[dict], title: str, row_key: str) -> str:
    """Tables of token perplexity and the tokenizer-independent metric; with row_key="scheme"
    one pair of tables per mode (a comparison), with row_key="mode" one pair (a single run)."""
    r0 = rows[0]
    parts = [f"## {title}", f"\n{r0['split']} split, trained at L={r0['train_length']}."]
    legend = []
    if any(str(r["status"]).startswith("skipped") for r in rows):
        legend.append("— = a length the scheme cannot represent (skipped)")
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
        parts += [
            f"\n### token perplexity ({name})\n",
            markdown_table(sub, "ppl", row_key),
            f"\n### {other.replace('_', ' ')} ({name})\n",
            markdown_table(sub, other, row_key),
        ]
    return "\n".join(parts)


def is_task(rows: list[dict]) -> bool:
    """Rows of a generated task's evaluation (accuracy), not of a corpus (perplexity)."""
    return any("accuracy" in r for r in rows)


def task_tables(rows: list[dict], name: str, row_key: str) -> list[str]:
    """The Markdown parts of a task's rows: exact-match accuracy, token accuracy, answer ppl."""
    chance = next((r for r in rows if is_finite(r.get("chance"))), None)
    note = (
        f"\nA uniform guess scores {chance['token_chance']:.3g} per answer token "
        f"({chance['chance']:.2g} exact match at L={chance['length']})."
        if chance
        else ""
    )
    return [
        f"\n### accuracy: the whole answer right ({name})\n",
        markdown_table(rows, "accuracy", row_key),
        f"\n### token accuracy: answer tokens right ({name})\n",
        markdown_table(rows, "token_accuracy", row_key),
        f"\n### answer perplexity ({name})\n",
        markdown_table(rows, "ppl", row_key),
        note,
    ]
