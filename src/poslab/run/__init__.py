"""A run: the checks before any work (validate.py), Lightning (lit.py, callbacks.py), tracking,
the run folder, the console and the Hydra app around it (cli.py), training itself (training.py)
and the listing of runs (runs.py)."""
