"""Draw the PNGs of written reports again from their comparison.json with the current figure
code (tables untouched).

python scripts/replot.py docs/results/rope_base docs/results/tasks_passkey ...
python scripts/replot.py docs/results/rope_base --out /tmp/rope_base   # elsewhere

The figures are those compare.py writes (poslab.report.files.report_figures), titled with the
first line of each folder's comparison.md. (`compare.py docs/results/NAME/comparison.json --out
DIR` draws the same figures but writes its tables again, with the current table code.) Bad
input (a folder without comparison.json, an --out that cannot be written) is one `error: ...`
line with exit code 2.
"""

from __future__ import annotations

from pathlib import Path

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import exit_on_config_error


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/replot.py", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="report folders (comparison.json)")
    parser.add_argument("--out", type=Path, default=None, help="one folder: write there instead")
    parser.add_argument("--stem", default="comparison", help="the report's file stem")
    args = parser.parse_args(argv)
    if args.out is not None:
        if len(args.folders) > 1:
            parser.error("--out takes one report folder")
        check_writable(args.out, "--out")
    from poslab.report.files import replot_report

    for folder in args.folders:
        paths = replot_report(folder, args.out, args.stem)
        print(f"{folder}: wrote {', '.join(p.name for p in paths.values())}", flush=True)
