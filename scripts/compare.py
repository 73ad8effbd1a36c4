"""Merge runs into one extrapolation table and plot.

python scripts/compare.py outputs/multirun/2026-11-22_03-00-00 --out docs/results/NAME

Without --out the files go to <first path>/comparison/ (outputs/comparison/NAME for a committed
study under docs/: committing is an explicit --out). Bad input (a path that does not exist
or holds no results, a results row without a valid field such as `length`, an --out that cannot
be written) ends with one `error: ...` line on stderr and exit code 2, and writes nothing.
"""

from poslab.report.compare import main

if __name__ == "__main__":
    main()
