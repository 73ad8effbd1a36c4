"""Analysis plots: what a positional scheme does to attention, in numbers.

* ``decay``: RoPE's long-range decay bound (RoFormer / the seed article). With
  θ_i = base^(−2i/d), i = 0..d/2−1, and the partial sums S_j = Σ_{i<j} e^{i·r·θ_i}, Abel
  summation bounds |q·k| at relative distance r by (max_i |h_{i+1} − h_i|)·Σ_{j=1..d/2} |S_j|;
  the part that depends on r, ``bound(r) = (1/(d/2))·Σ_j |S_j|``, is plotted (log distance axis,
  up to 16k) for several bases and head dims. bound(0) = (d/2 + 1)/2.
* ``wavelength``: λ_i = 2π/θ_i of every rotary frequency against a training length L, the
  quantity YaRN's ramp uses (r_i = L/λ_i, γ_i = clamp((r_i − α)/(β − α), 0, 1), α = 1, β = 32):
  dims with λ_i ≤ L complete a full period within L.
* ``sinusoidal``: the similarity p_m·p_n/(d/2) of the sinusoidal position vectors of Vaswani
  et al. against m − n ("oscillating decay"). Every vector has |p|² = d/2, so this is also their
  cosine similarity; it equals (1/(d/2))·Σ_i cos((m − n)·ω_i) and depends on m − n only.
* ``collisions``: the mixed-precision position bug (seed 001). For the positions 0..N−1 of the
  real schemes with ``position_dtype=bf16`` (and the fp32 default): the fraction of positions
  bf16 holds exactly, of distinct rotary angle vectors, and of keys whose ALiBi distance to the
  last query is wrong. bf16 keeps 8 significant bits: every integer up to 256, then 128 values
  per octave, so ~11% of 0..8191 stay exact.
* ``theta``: for checkpoints trained with a learnable θ (``pos.learnable_theta=true``), the
  ratio θ_i/θ_i(init) of every rotary frequency after training, against the frequency index
  (one line per run, labelled by ``pos.theta_param`` and seed): the RoFormer author's "θ barely
  moves", measured.
* ``attention``: per layer and head of trained checkpoints, on validation text at `factor`× the
  training length L: (a) the mean attention distance Σ_n w_mn·(m − n), averaged over all
  queries; (b) the attention mass on keys at distance m − n ≥ L, averaged over the queries
  m ≥ L (the only ones that have such keys). The weights are the reference ones
  (`Blockwise.weights`, every scheme hook applied), recorded by a kernel installed in the model.
  Uniform causal attention is drawn for reference: mean distance (T − 1)/4, mass beyond L
  mean_{m ≥ L} (m − L + 1)/(m + 1).
* ``t5``: for t5 checkpoints, the learned bias of every distance bucket (per head and their
  mean) against the bucket's first distance, and the share of a causal window's query–key
  pairs in each bucket at L and at `factor`× L (distance d occurs for T − d of T(T+1)/2
  pairs): every distance ≥ ``pos.max_distance`` shares the last bucket.

Each analysis writes NAME.png and NAME.csv to the output folder (default outputs/analysis;
`--out docs/results/analysis` for the committed set).
With ``--from-csv`` it only draws NAME.png again from the NAME.csv already in the output folder
(no computation and no checkpoints: the committed figures redrawn with the current plotting
code; an attention.csv without a split column is titled with --split).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from poslab.analysis.attention import attention_figure, run_attention
from poslab.analysis.checkpoints import checkpoint_path
from poslab.analysis.collisions import collisions_figure, run_collisions
from poslab.analysis.decay import decay_figure, run_decay
from poslab.analysis.figures import read_csv, save_png
from poslab.analysis.sinusoidal import run_sinusoidal, sinusoidal_figure
from poslab.analysis.t5_buckets import run_t5_buckets, t5_buckets_figure
from poslab.analysis.theta import run_theta
from poslab.analysis.wavelength import run_wavelength, wavelength_figure
from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.positions.rope_theta import theta_figure

ANALYSES = ("decay", "wavelength", "sinusoidal", "collisions", "attention", "theta", "t5", "all")
WITH_CHECKPOINTS = ("attention", "theta", "t5")
WITHOUT_CHECKPOINTS = ("decay", "wavelength", "sinusoidal", "collisions")  # what `all` runs
# committing figures is an explicit --out docs/results/analysis; by default the tree stays clean
DEFAULT_OUT = Path("outputs/analysis")


def parser() -> argparse.ArgumentParser:
    """Bad arguments: one `error: ...` line and exit code 2, as every poslab entry point."""
    p = OneLineParser(
        prog="scripts/analysis.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("analysis", help=f"one of: {', '.join(ANALYSES)} (all: the first three)")
    p.add_argument("checkpoints", nargs="*", help="attention, theta: .ckpt files or run folders")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    p.add_argument("--bases", type=float, nargs="+", default=[100.0, 10000.0, 500000.0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument(
        "--max-distance", type=int, default=16384, help="decay, collisions (default 16384)"
    )
    p.add_argument("--train-length", type=int, default=512, help="wavelength: L (default 512)")
    p.add_argument("--d-models", type=int, nargs="+", default=[256], help="sinusoidal")
    p.add_argument("--sin-distance", type=int, default=2048, help="sinusoidal (default 2048)")
    p.add_argument(
        "--factor", type=float, default=4.0, help="attention, t5: T = factor × L (default 4)"
    )
    p.add_argument("--windows", type=int, default=4, help="attention: windows of T tokens")
    p.add_argument(
        "--split",
        default="validation",
        choices=("train", "validation", "test"),
        help="attention: corpus split",
    )
    p.add_argument("--data-path", default=None, help="attention: corpus, if not the stored one")
    p.add_argument("--block-size", type=int, default=1024, help="attention: query block")
    p.add_argument(
        "--from-csv",
        action="store_true",
        help="only draw NAME.png again from NAME.csv in --out (no computation, no checkpoints)",
    )
    return p


def check_args(args: argparse.Namespace) -> None:
    if args.analysis not in ANALYSES:
        raise ConfigError(
            f"unknown analysis {args.analysis!r}; choose one of {', '.join(ANALYSES)}"
        )
    if args.from_csv:
        if args.analysis not in (*FROM_CSV, "all"):
            raise ConfigError(f"--from-csv draws {', '.join(FROM_CSV)} again, not {args.analysis}")
        if args.checkpoints:
            raise ConfigError("--from-csv takes no checkpoints: it reads NAME.csv in --out")
        names = WITHOUT_CHECKPOINTS if args.analysis == "all" else (args.analysis,)
        for name in names:
            stem = CSV_NAMES.get(name, name)
            if not (args.out / f"{stem}.csv").is_file():
                raise ConfigError(f"--from-csv: no {stem}.csv in {args.out}; pass --out FOLDER")
        return
    if args.analysis in WITH_CHECKPOINTS and not args.checkpoints:
        raise ConfigError(f"{args.analysis} needs checkpoints: pass .ckpt files or run folders")
    if args.analysis not in WITH_CHECKPOINTS and args.checkpoints:
        raise ConfigError(
            f"{args.analysis} takes no checkpoints (got {' '.join(args.checkpoints)}); "
            f"only {', '.join(WITH_CHECKPOINTS)} do"
        )
    positive = {
        "--head-dims": min(args.head_dims),
        "--max-distance": args.max_distance,
        "--train-length": args.train_length,
        "--d-models": min(args.d_models),
        "--sin-distance": args.sin_distance,
        "--windows": args.windows,
        "--block-size": args.block_size,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} must be ≥ 1 (got {value})")
    for name, dims in (("--head-dims", args.head_dims), ("--d-models", args.d_models)):
        if any(d % 2 for d in dims):
            raise ConfigError(f"{name} must be even (pairs of dims), got {dims}")
    if not all(math.isfinite(b) and b > 1 for b in args.bases):
        raise ConfigError(f"--bases must be finite and > 1 (got {args.bases})")
    if not (math.isfinite(args.factor) and args.factor > 0):
        raise ConfigError(f"--factor must be finite and > 0 (got {args.factor})")
    if args.data_path is not None and not Path(args.data_path).expanduser().exists():
        raise ConfigError(
            f"--data-path {args.data_path} does not exist; pass the corpus folder the "
            "checkpoints were trained on"
        )
    check_writable(args.out, "--out")


FROM_CSV = ("decay", "wavelength", "sinusoidal", "collisions", "attention", "theta", "t5")
CSV_NAMES = {"t5": "t5_buckets"}  # the analyses whose files are not named after them


def replot(out: Path, name: str, split: str = "validation") -> Path:
    """NAME.png drawn again from NAME.csv in `out` with the current figure code; the CSV is not
    touched. Rows of an attention.csv without a split column take `split`."""
    stem = CSV_NAMES.get(name, name)
    rows = read_csv(out / f"{stem}.csv")
    if not rows:
        raise ConfigError(f"{out / stem}.csv has no rows to plot")
    if name == "attention":
        rows = [{**r, "split": r.get("split") or split} for r in rows]
    figures = {
        "decay": decay_figure,
        "wavelength": wavelength_figure,
        "sinusoidal": sinusoidal_figure,
        "collisions": collisions_figure,
        "attention": attention_figure,
        "theta": theta_figure,
        "t5": t5_buckets_figure,
    }
    return save_png(figures[name](rows), out, stem)


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    check_args(args)
    todo = WITHOUT_CHECKPOINTS if args.analysis == "all" else (args.analysis,)
    if args.from_csv:
        for name in todo:
            replot(args.out, name, args.split)
        return
    if args.analysis in WITH_CHECKPOINTS:
        for p in args.checkpoints:  # every path, before the first one is analysed
            checkpoint_path(p)
    # the output folder is made by the first analysis that writes (save)
    for name in todo:
        if name == "decay":
            run_decay(args.out, args.bases, args.head_dims, args.max_distance)
        elif name == "wavelength":
            run_wavelength(args.out, args.bases, args.head_dims, args.train_length)
        elif name == "sinusoidal":
            run_sinusoidal(args.out, args.d_models, args.sin_distance)
        elif name == "collisions":
            run_collisions(args.out, args.max_distance)
        elif name == "theta":
            run_theta(args.out, args.checkpoints)
        elif name == "t5":
            run_t5_buckets(args.out, args.checkpoints, args.factor)
        else:
            run_attention(
                args.out,
                args.checkpoints,
                args.factor,
                args.windows,
                args.split,
                args.data_path,
                args.block_size,
            )
