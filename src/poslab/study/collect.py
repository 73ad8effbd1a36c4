"""Copy a study's finished results (not its checkpoints) into a folder that is committed:

    python scripts/collect_study.py outputs/studies/paper_cpu docs/results/paper_cpu

For each job whose training finished and whose every evaluation of the study (`evals:`) has a
result: DEST/runs/<job>/ gets its extrapolation/extrapolation.json, .hydra/config.yaml,
run.json and status.json, and DEST/evals/<name>/<job>/ each evaluation's extrapolation.json with
the run's config and run.json beside it, so that compare.py and scripts/budget.py read DEST
alone, on any machine. A job already in DEST is left as it is (a chunk adds, never rewrites).
Rows without a recorded provenance (made before it was recorded) get one from the run's config,
with the code version the study recorded when it launched the job, or `--code`. Prints one ledger
line per job copied: its name, when it finished, its wall minutes and the machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser
from poslab.errors import ConfigError, exit_on_config_error

RESULT = Path("extrapolation") / "extrapolation.json"
KEPT = (".hydra/config.yaml", "run.json", "status.json")


def finished_jobs(study: Path) -> list[str]:
    """The jobs of the study folder whose training and every evaluation have a result."""
    state = json.loads((study / "study.json").read_text())
    return [name for name, job in state["jobs"].items() if job.get("state") == "completed"]


def _with_provenance(result: Path, run: Path, code: str | None) -> str:
    """The rows of `result` as JSON, each with a provenance (its own, else from `run`'s config
    and `code`)."""
    from poslab.report.provenance import provenance_of_run

    rows = json.loads(result.read_text())
    provenance = provenance_of_run(run, rows)
    if provenance.get("code") is None and code:
        provenance = {**provenance, "code": code}
    return json.dumps([{**r, "provenance": r.get("provenance") or provenance} for r in rows])


def _copy(run: Path, result: Path, dest: Path, code: str | None) -> None:
    (dest / RESULT).parent.mkdir(parents=True, exist_ok=True)
    (dest / RESULT).write_text(_with_provenance(result, run, code))
    for name in KEPT:
        if (run / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run / name, dest / name)


def collect(study: Path, dest: Path, code: str | None = None) -> list[dict[str, Any]]:
    """Copy every finished job not yet in `dest`; returns their ledger entries."""
    if not (study / "study.json").is_file():
        raise ConfigError(f"{study} holds no study (study.json); pass a study's --out folder")
    state = json.loads((study / "study.json").read_text())
    evaluations = (
        sorted(p.name for p in (study / "evals").glob("*")) if (study / "evals").is_dir() else []
    )
    copied = []
    for name in finished_jobs(study):
        if (dest / "runs" / name / RESULT).is_file():
            continue
        run = study / "runs" / name
        job = state["jobs"][name]
        made_by = code or job.get("code") or state.get("code")
        _copy(run, run / RESULT, dest / "runs" / name, made_by)
        for evaluation in evaluations:
            folder = study / "evals" / evaluation / name
            if (folder / RESULT).is_file():
                _copy(run, folder / RESULT, dest / "evals" / evaluation / name, made_by)
        status = json.loads((run / "status.json").read_text())
        copied.append(
            {
                "job": name,
                "finished": status.get("time"),
                "wall_min": round(job.get("wall_s", 0.0) / 60, 1),
                "device": job.get("device"),
                "code": made_by,
                "tok_per_s": round(status.get("train_tokens_per_s_median") or 0),
            }
        )
    return copied


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/collect_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study's folder (its --out)")
    parser.add_argument("dest", help="the folder to commit, e.g. docs/results/paper_cpu")
    parser.add_argument(
        "--code",
        default=None,
        help="the code version of jobs launched before the study recorded it (e.g. 'git 5fa6630')",
    )
    args = parser.parse_args(argv)
    entries = collect(Path(args.study), Path(args.dest), args.code)
    for e in entries:
        print(
            f"| {e['job']} | {e['finished']} | {e['wall_min']} | {e['tok_per_s']:,} | "
            f"{e['device']} | {e['code']} |"
        )
    print(f"copied {len(entries)} finished job(s) into {args.dest}")
