"""List training runs: `python scripts/runs.py [FOLDER] [--last N]` (the same command as
`poslab-runs`; the code is poslab/run/runs.py)."""

from poslab.run.runs import main

if __name__ == "__main__":
    main()
