"""LongRoPE's factor search for a finished rotary run, at a target length past its own.

python scripts/longrope_search.py outputs/runs/DATE/TIME_NAME --target 512

See poslab/evaluation/longrope_search.py.
"""

from poslab.evaluation.longrope_search import main

if __name__ == "__main__":
    main()
