"""A study's budget axis: each row's ratio at the longest length and its difference to the
baseline, against training tokens, with 95% intervals over seeds.

python scripts/budget.py RUNS... --baseline rope --out DIR --primary

Bad input (no results, one budget only, an --out that cannot be written) ends with one
`error: ...` line on stderr and exit code 2, and writes nothing.
"""

from poslab.report.budget import main

if __name__ == "__main__":
    main()
