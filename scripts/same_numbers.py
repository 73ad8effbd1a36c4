"""Do two code versions compute the same numbers? Each version of the computing code between
two commits runs the same short training and evaluation; every tensor and score is compared.

python scripts/same_numbers.py FIRST LAST --pos rope alibi --out DIR -- experiment=paper_cpu

Bad input (a commit git does not know, an --out that cannot be written) ends with one
`error: ...` line on stderr and exit code 2.
"""

from poslab.study.same_numbers import main

if __name__ == "__main__":
    main()
