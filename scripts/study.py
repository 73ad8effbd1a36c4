"""Run every job of a study recipe on the devices present, then merge their results.

python scripts/study.py paper_gpu data.path=../shared/data/wikitext-2 --dry-run
python scripts/study.py paper_gpu data.path=DIR                       # one GPU, or every GPU
python scripts/study.py paper_gpu data.path=DIR --launcher submitit_slurm \
    hydra.launcher.partition=gpu                                       # SLURM

The same command again resumes: finished jobs are skipped, cut-off jobs continue from their
checkpoints. `python scripts/study.py --help` for every option; docs/recipes.md for the recipes.
"""

import sys

from poslab.study.driver import main

if __name__ == "__main__":
    sys.exit(main())
