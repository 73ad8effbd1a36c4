"""Draw written reports' figures again: `python scripts/replot.py FOLDER ...` (the same command
as `poslab-replot`; the code is poslab/report/replot.py)."""

from poslab.report.replot import main

if __name__ == "__main__":
    main()
