"""Analysis plots: what a positional scheme does to attention, in numbers.

One module per analysis (decay, wavelength, sinusoidal, collisions, attention, theta), each
writing NAME.png and NAME.csv; cli.py is the command line (scripts/analysis.py, python -m
poslab.analysis), and its docstring, the --help, says what each analysis computes.
"""

# The package's public functions, re-exported so that `from poslab.analysis import X` keeps
# working for notebooks and scripts; poslab's own modules import from the submodules.

from poslab.analysis.attention import (
    AttentionRecorder,
    AttentionStats,
    UnsupportedLength,
    analyse_checkpoint,
    attention_statistics,
    check_attention_input,
    run_attention,
    uniform_reference,
    validation_windows,
)
from poslab.analysis.checkpoints import checkpoint_path, scheme_name
from poslab.analysis.cli import ANALYSES, DEFAULT_OUT, check_args, main, parser
from poslab.analysis.collisions import position_collisions, run_collisions
from poslab.analysis.decay import decay_bound, decay_distances, rope_thetas, run_decay
from poslab.analysis.figures import save, write_csv
from poslab.analysis.sinusoidal import run_sinusoidal, sinusoidal_similarity
from poslab.analysis.theta import run_theta, theta_rows
from poslab.analysis.wavelength import YARN_ALPHA, YARN_BETA, run_wavelength, wavelengths, yarn_ramp
from poslab.positions.rope_theta import plot_theta, theta_ratio_rows

__all__ = [
    "ANALYSES",
    "AttentionRecorder",
    "AttentionStats",
    "DEFAULT_OUT",
    "UnsupportedLength",
    "X`",
    "YARN_ALPHA",
    "YARN_BETA",
    "analyse_checkpoint",
    "attention_statistics",
    "check_args",
    "check_attention_input",
    "checkpoint_path",
    "decay_bound",
    "decay_distances",
    "main",
    "parser",
    "plot_theta",
    "position_collisions",
    "rope_thetas",
    "run_attention",
    "run_collisions",
    "run_decay",
    "run_sinusoidal",
    "run_theta",
    "run_wavelength",
    "save",
    "scheme_name",
    "sinusoidal_similarity",
    "theta_ratio_rows",
    "theta_rows",
    "uniform_reference",
    "validation_windows",
    "wavelengths",
    "write_csv",
    "yarn_ramp",
]
