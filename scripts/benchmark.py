"""The benchmark: `python scripts/benchmark.py --help` (the same command as `poslab-bench`; the
code is src/poslab/bench/)."""

from poslab.bench.cli import main

if __name__ == "__main__":
    main()
