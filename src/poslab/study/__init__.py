"""Studies: one command runs every training job of a recipe (conf/study/NAME.yaml).

* `recipe` reads a study and composes each job's config (every job checked before any work).
* `cost` estimates each job's FLOPs, memory and minutes from its config.
* `devices` finds the devices present and their measured matmul rate.
* `driver` prints the plan, runs the jobs (several per GPU, every GPU; or on SLURM through
  Hydra's submitit launcher), keeps each result as it finishes, resumes a cut-off study, and
  ends with compare.py's merged table. `python scripts/study.py --help`.
"""
