"""Does the word vocabulary change a comparison? Each row's paired difference to the baseline in
a committed table and in new runs, and the change, paired by seed.

python scripts/vocabulary_change.py OLD/comparison.json RUNS... --baseline rope --out DIR
"""

from poslab.report.vocabulary_change import main

if __name__ == "__main__":
    main()
