"""List training runs, newest first: the settings that tell them apart (data, scheme, model, L,
steps, seed), where each stands (status, step), its validation perplexity and its perplexity
(or accuracy) at the longest evaluated length, and its folder.

python scripts/runs.py                 # every run under outputs/
python scripts/runs.py outputs/multirun/2026-11-25_10-00-00_ab12cd   # one sweep
python scripts/runs.py --last 5

`outputs/latest` always points at the newest run's folder.
"""

from __future__ import annotations

from pathlib import Path

from poslab.arguments import OneLineParser, at_least
from poslab.errors import ConfigError, exit_on_config_error


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/runs.py", description=__doc__)
    parser.add_argument("folder", nargs="?", type=Path, default=Path("outputs"))
    parser.add_argument("--last", type=at_least(1), default=None, help="only the N newest runs")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise ConfigError(f"{args.folder} is not a folder; pass the folder that holds runs")
    from poslab.run.runs import find_runs, runs_table

    runs = find_runs(args.folder)
    if args.last is not None:
        runs = runs[: max(0, args.last)]
    if not runs:
        print(f"no runs under {args.folder} (a run folder holds status.json)", flush=True)
        return
    print(runs_table(runs, args.folder), flush=True)


if __name__ == "__main__":
    main()
