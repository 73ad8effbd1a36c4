"""python -m poslab.analysis: the same command line as scripts/analysis.py."""

from poslab.analysis.cli import main

main()
