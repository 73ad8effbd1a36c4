"""Chance and every stated shortcut of a task, per evaluation length, without a model.

python scripts/baselines.py data=grid --lengths 64 256 1024

See poslab/evaluation/baselines.py.
"""

from poslab.evaluation.baselines import main

if __name__ == "__main__":
    main()
