"""Find runs: every training run under a folder (default `outputs/`), newest first, with the
settings that tell runs apart, where it stands and its final numbers (scripts/runs.py).

A run folder is one with a `status.json` (poslab writes it when a run starts and at every change
of state) and a `run.json` (its resolved settings, written when it starts).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, at_least
from poslab.errors import ConfigError, exit_on_config_error

COLUMNS = ("started", "status", "data", "scheme", "model", "L", "steps", "seed", "options",
           "val ppl", "ppl @ longest", "evals", "parent", "folder")  # fmt: skip
# overrides a column already shows, or that change where a run goes and how it prints, not what
# it is: the rest (pos.learnable_theta=true, optim.lr=...) are the options that tell runs apart
SHOWN = ("pos=", "model=", "seed=", "trainer.max_steps=", "train.max_tokens=", "data.seq_len=",
         "data.path=", "data=", "resume=", "extend=", "trainer.enable_progress_bar=", "hydra.",
         "logger")  # fmt: skip


@dataclass
class RunSummary:
    folder: Path
    started: float  # the folder's creation (modification) time
    status: dict[str, Any]
    settings: dict[str, Any]  # run.json (poslab.run.run_folder.write_run_settings)
    results: list[dict]
    evaluations: list[str]  # the run's evaluation folders: extrapolation/, then eval.py's
    overrides: list[str]  # the command line's (Hydra's .hydra/overrides.yaml)

    def cells(self, root: Path) -> list[str]:
        import time

        settings, status = self.settings, self.status
        step = status.get("step")
        steps = settings.get("max_steps")
        done = f"{step}/{steps}" if step is not None and steps else str(steps or "?")
        ppl = status.get("val_ppl")
        accuracy = status.get("val_accuracy")
        val = f"{ppl:.2f}" if _finite(ppl) else (f"acc {accuracy:.2f}" if _finite(accuracy) else "")
        return [
            time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)),
            str(status.get("status", "?")),
            str(settings.get("data", "?")),
            str(settings.get("scheme", "?")),
            str(settings.get("model", "?")),
            str(settings.get("seq_len", "?")),
            done,
            str(settings.get("seed", "?")),
            self.options(),
            val,
            self.longest(),
            str(len(self.evaluations)),
            self.parent(root),
            str(_shown(self.folder, root)),
        ]

    def options(self) -> str:
        """The command line's overrides that no other column shows (`experiment=` included)."""
        shown = [o for o in self.overrides if not o.lstrip("+~").startswith(SHOWN)]
        return " ".join(shown).replace("|", "\\|")

    def parent(self, root: Path) -> str:
        """The run a child of extend= started from, and the start of its checkpoint's SHA-256."""
        parent = self.settings.get("parent")
        if not parent:
            return ""
        sha = str(self.settings.get("parent_sha256") or "")[:12]
        return f"{_shown(Path(parent), root)} (sha256 {sha})" if sha else str(parent)

    def longest(self) -> str:
        """The perplexity (or accuracy) at the longest evaluated length, `ppl (16x)`."""
        ok = [r for r in self.results if r.get("status") == "ok" and r.get("mode") != "sliding"]
        if not ok:
            return ""
        row = max(ok, key=lambda r: r["length"])
        value = row.get("accuracy", row.get("ppl"))
        name = "acc " if "accuracy" in row else ""
        return f"{name}{value:.2f} ({row.get('factor', 0):g}x)" if _finite(value) else ""


def _shown(folder: Path, root: Path) -> Path:
    """`folder` relative to the listed root where it lies under it."""
    try:
        return folder.resolve().relative_to(root.resolve())
    except ValueError:
        return folder


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _overrides(path: Path) -> list[str]:
    """A run's command-line overrides; none where the file is missing or unreadable."""
    import yaml

    try:
        overrides = yaml.safe_load(path.read_text()) if path.is_file() else []
    except (OSError, yaml.YAMLError):
        return []
    return [str(o) for o in overrides] if isinstance(overrides, list) else []


def find_runs(root: Path) -> list[RunSummary]:
    """Every run folder under `root` (or `root` itself), newest first."""
    runs = []
    for status_file in sorted(root.rglob("status.json")):
        folder = status_file.parent
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):  # cut short: the run is listed, saying so (#43)
            status = {"status": "unreadable status.json"}
        try:
            settings_file = folder / "run.json"
            settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
        except (OSError, ValueError):
            settings = {}
        results_file = folder / "extrapolation" / "extrapolation.json"
        try:
            results = json.loads(results_file.read_text()) if results_file.is_file() else []
        except (OSError, ValueError):
            results = []
        # written once when the command (Hydra) or the run (run.json) starts
        stamps = [folder / ".hydra" / "overrides.yaml", folder / "run.json", status_file]
        started = next(p for p in stamps if p.is_file()).stat().st_mtime
        # eval.py never overwrites: each re-evaluation is a folder extrapolation-<time>[-<variant>]
        evaluations = sorted(
            p.parent.name for p in folder.glob("extrapolation*/extrapolation.json")
        )
        overrides = _overrides(folder / ".hydra" / "overrides.yaml")
        runs.append(RunSummary(folder, started, status, settings, results, evaluations, overrides))
    return sorted(runs, key=lambda r: r.started, reverse=True)


def runs_table(runs: list[RunSummary], root: Path) -> str:
    """A Markdown table of `runs`."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    lines += ["| " + " | ".join(run.cells(root)) + " |" for run in runs]
    return "\n".join(lines)


USAGE = """List training runs, newest first: the settings that tell them apart (data, scheme,
model, L, steps, seed, and the command line's other options, e.g. pos.learnable_theta=true),
where each stands (status, step), its validation perplexity and its
perplexity (or accuracy) at the longest evaluated length, the run it was fine-tuned from
(extend=; with its checkpoint's SHA-256) and its folder.

poslab-runs                 # every run under outputs/ (or python scripts/runs.py)
poslab-runs outputs/multirun/2026-11-25_10-00-00_ab12cd   # one sweep
poslab-runs --last 5

`outputs/latest` always points at the newest run's folder.
"""


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="scripts/runs.py",
        description=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the examples one per line
    )
    parser.add_argument("folder", nargs="?", type=Path, default=Path("outputs"))
    parser.add_argument("--last", type=at_least(1), default=None, help="only the N newest runs")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise ConfigError(f"{args.folder} is not a folder; pass the folder that holds runs")
    runs = find_runs(args.folder)
    if args.last is not None:
        runs = runs[: max(0, args.last)]
    if not runs:
        print(f"no runs under {args.folder} (a run folder holds status.json)", flush=True)
        return
    print(runs_table(runs, args.folder), flush=True)
