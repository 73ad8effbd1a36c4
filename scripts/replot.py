"""Draw written reports' figures again: `python scripts/replot.py FOLDER ...` (the same command
as `poslab-replot`; the code is poslab/evaluation/replot.py)."""

from poslab.evaluation.replot import main

if __name__ == "__main__":
    main()
