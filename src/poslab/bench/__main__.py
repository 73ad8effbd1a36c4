"""`python -m poslab.bench`: the benchmark (cli.py); its memory server runs this way too."""

from poslab.bench.cli import main

main()
