"""Merge runs into one extrapolation table and plot.

python scripts/compare.py outputs/multirun/2026-11-22_03-00-00 --out docs/results/NAME

Without --out the files go to <first path>/comparison/. A path that does not exist or holds no
results ends with one `error: ...` line on stderr and exit code 2.
"""

from poslab.evaluation.compare import main

if __name__ == "__main__":
    main()
