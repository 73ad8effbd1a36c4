"""The benchmark (`poslab-bench`, `python scripts/benchmark.py`; cli.py's docstring says what it
measures): configs.py builds
each scheme's model config and holds the options, timing.py times training and evaluation jobs,
peer.py builds the x-transformers peer, memory.py measures peak memory in fresh processes,
run.py runs them all, report.py writes the tables and the targets' verdicts.

generation.py is the generation benchmark (`poslab-bench-generation`,
`python scripts/benchmark_generation.py`): greedy decoding with and without the key/value cache,
against transformers' Llama."""
