"""Merge runs into one extrapolation table and plot.

python scripts/compare.py outputs/multirun/2026-11-22_03-00-00 --out docs/results/NAME
"""

from poslab.evaluation.compare import main

if __name__ == "__main__":
    main()
