"""The generation benchmark: `python scripts/benchmark_generation.py --help` (the same command
as `poslab-bench-generation`; the code is src/poslab/bench/generation.py)."""

from poslab.bench.generation import main

if __name__ == "__main__":
    main()
