"""A study's end: compare.py's merged table of the finished jobs (<out>/comparison/), and
<out>/study.md with each job's state, wall time, throughput and MFU (from the run's own
status.json), and every job without a result with the command that resumes it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError
from poslab.study.cost import job_cost
from poslab.study.folders import checkpoint_step, eval_folder, evals_missing, job_status
from poslab.study.plan import Plan, PlannedJob

RESULT = Path("extrapolation") / "extrapolation.json"
# what a job whose run completed without its result is told: the study's command skips it
SKIPPED = "running the study again skips a completed job"


def flops_per_token(planned: Any, run: Path, plan: dict[str, Any]) -> float:
    """The job's training FLOPs per token with the vocabulary its run really had (the plan
    assumed the recipe's figure; a capped or smaller corpus has fewer words)."""
    try:
        vocab = json.loads((run / RESULT).read_text())[0]["vocab_size"]
    except (OSError, ValueError, LookupError, TypeError):
        return planned.cost.train_flops_per_token
    config = planned.job.config
    actual = {**config, "data": {**config["data"], "vocab_size": vocab}}
    return job_cost(actual, {**plan, "vocab_size": vocab}).train_flops_per_token


def missing_section(missing: list[tuple[str, str]], total: int, resume: str) -> str:
    lines = [f"\n\n### jobs without a result ({len(missing)} of {total})\n"]
    lines += [f"- {name}: {why}" for name, why in missing]
    if any(SKIPPED not in why for _, why in missing):  # a re-run helps only those
        lines.append(f"\nResume them (finished jobs are skipped): `{resume}`")
    return "\n".join(lines)


def write_report(
    plan: Plan, out: Path, state: dict[str, Any], minutes: float, resume: str
) -> list[str]:
    """Write the comparison and study.md; returns the names of the jobs without a result."""
    study = plan.study
    finished, missing, rows = [], [], []
    for planned in plan.jobs:
        name = planned.job.name
        run = out / "runs" / name
        status = job_status(out, name)
        entry = state["jobs"].get(name, {})
        why = _why_missing(run, status, entry)
        if why is None:
            finished.append(run)
            if left := evals_missing(out, study, name):
                missing.append((name, entry.get("why") or f"evaluation {left[0]} not run yet"))
        else:
            missing.append((name, why))
        rows.append(_job_row(plan, planned, run, status, entry, state.get("launcher")))
    text = ""
    comparison = out / "comparison"
    chunk = study.baseline in study.left_out_schemes  # --only left the baseline's jobs out
    if finished:
        text = _compare(finished, comparison, study.name, study.baseline, chunk=chunk)
        if missing:
            section = missing_section(missing, len(plan.jobs), resume)
            with open(comparison / "comparison.md", "a") as f:
                f.write(section + "\n")
    for evaluation, overrides in study.evals.items():
        evaluated = [
            eval_folder(out, evaluation, r.name)
            for r in finished
            if evaluation not in evals_missing(out, study, r.name)
        ]
        if evaluated:
            _compare(
                evaluated,
                out / f"comparison-{evaluation}",
                f"{study.name} ({' '.join(overrides)})",
                study.baseline,
                chunk=chunk,
            )
    page = _study_page(plan, state, minutes, resume, rows)
    if missing:
        page.append(missing_section(missing, len(plan.jobs), resume))
    if finished:
        page.append("\nThe merged table: [comparison/comparison.md](comparison/comparison.md)")
    (out / "study.md").write_text("\n".join(page) + "\n")
    if missing:
        print(missing_section(missing, len(plan.jobs), resume).strip(), flush=True)
    print(f"wrote {out}/study.md" + (f" and {comparison}/" if text else ""), flush=True)
    return [name for name, _ in missing]


def _why_missing(run: Path, status: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """Why the job in `run` has no result to merge (with its last checkpoint, where resuming
    starts), or None where it has one. `status`: its status.json; `entry`: its state."""
    if status.get("status") == "completed" and (run / RESULT).is_file():
        return None
    if status.get("status") == "completed":
        # a re-run skips a completed job (train.py resume= on it writes nothing): say what helps
        return (
            f"completed, but {run / RESULT} is missing; {SKIPPED}: restore that file, or "
            f"delete {run} to train the job again"
        )
    step = checkpoint_step(run)
    why = entry.get("why") or ("not started" if not status else status.get("status"))
    where = f", last checkpoint at step {step}" if step else ""
    return f"{why}{where}"


def _job_row(
    plan: Plan,
    planned: PlannedJob,
    run: Path,
    status: dict[str, Any],
    entry: dict[str, Any],
    launcher: str | None,
) -> str:
    """The job's line of study.md's table. MFU only for jobs the local launcher ran: the matmul
    rate it divides by was measured on this machine."""
    rate = status.get("train_tokens_per_s_median")
    mfu = (
        rate * flops_per_token(planned, run, plan.study.plan) / plan.rate
        if rate and launcher == "local"
        else None
    )
    loss = status.get("best_val_loss")
    return (
        f"| {planned.job.name} | {entry.get('state', 'pending')} | {status.get('step', '—')} | "
        f"{entry.get('wall_s', 0) / 60:.1f} | {f'{rate:,.0f}' if rate else '—'} | "
        f"{f'{mfu:.1%}' if mfu is not None else '—'} | "
        f"{f'{loss:.4f}' if isinstance(loss, float) else '—'} |"
    )


def _study_page(
    plan: Plan, state: dict[str, Any], minutes: float, resume: str, rows: list[str]
) -> list[str]:
    """study.md's lines up to the end of its table of jobs (`rows`): the command, when and
    where it ran, and what the table's figures mean."""
    devices = ", ".join(d.label for d in plan.devices)
    return [
        f"# study {plan.study.name}\n",
        f"- command: `{resume}`",
        f"- written: {time.strftime('%Y-%m-%d %H:%M:%S')}; this invocation ran {minutes:.1f} min",
        f"- devices: {devices} ({state.get('launcher')}); {plan.slots} job(s) at a time per "
        f"device; matmul {plan.rate / 1e12:.3g} TFLOP/s measured in {plan.precision}",
        "- tok/s: the median of the run's steps (validation left out); MFU: tok/s × the "
        "training FLOPs per token (poslab.study.cost) ÷ the measured matmul rate; jobs that "
        "shared a device each report their share",
        "",
        "| job | status | step | wall min | tok/s | MFU | best val loss |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]


def row_names(runs: list[Path]) -> dict[str, str]:
    """Shorter row names where one scheme trained at two lengths (the paper's upper bound): the
    row at the study's usual length keeps the scheme's name, the other reads `scheme (L=8192)`,
    instead of compare.py's list of every option in which the runs differ. {} where those names
    would not tell the rows apart."""
    from poslab.report.compare import label_rows

    trained = {r["scheme"]: r["train_length"] for r in label_rows([r / RESULT for r in runs])}
    return short_names(trained)


def short_names(trained: dict[str, int]) -> dict[str, str]:
    """row_names from compare.py's labels (`rope [data.seq_len=128, pos.base=500]`) and their
    training lengths: only the length is shortened to `(L=…)`; every other option in which the
    rows differ stays in the name (a `pos.base=500` row once read `rope (L=128)`)."""
    from collections import Counter

    usual = Counter(trained.values()).most_common(1)[0][0]
    names = {}
    for label, length in trained.items():
        base, _, options = label.partition(" [")
        if not options:
            continue
        kept = [
            o for o in options.removesuffix("]").split(", ") if not o.startswith("data.seq_len=")
        ]
        name = f"{base} [{', '.join(kept)}]" if kept else base
        names[label] = name if length == usual else f"{name} (L={length})"
    shown = [names.get(label, label) for label in trained]
    return names if len(set(shown)) == len(shown) else {}


def _compare(
    runs: list[Path],
    out: Path,
    name: str,
    baseline: str | None,
    names: dict[str, str] | None = None,
    chunk: bool = False,
) -> str:
    """compare.py's table; without the baseline where its row has not finished, or where this
    chunk (`--only`) left the baseline's jobs out (said)."""
    from poslab.report.compare import compare

    title = f"{name}: perplexity vs evaluation length"
    names = row_names(runs) if names is None else names
    try:
        compare(runs, out, title=title, baseline=baseline, rename=names)
    except ConfigError as err:
        if baseline is None or "--baseline" not in str(err):
            raise
        # the recipe's baseline names a scheme (checked before any work); its row is missing
        # because none of its jobs finished, or because its rows carry options in their labels
        why = (
            "this chunk (--only) leaves its jobs out: pair the collected runs with "
            "scripts/compare.py or scripts/budget.py"
            if chunk
            else "its jobs have not finished, or its rows differ in options"
        )
        print(
            f"no paired differences: {str(err).split('; ', 1)[-1]} (the baseline {baseline!r} "
            f"is not one of them: {why})"
        )
        compare(runs, out, title=title, rename=names)
    return (out / "comparison.md").read_text()
