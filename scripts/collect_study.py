"""Copy a study's finished results (not its checkpoints) into a folder to commit.

python scripts/collect_study.py outputs/studies/paper_cpu docs/results/paper_cpu
"""

from poslab.study.collect import main

if __name__ == "__main__":
    main()
