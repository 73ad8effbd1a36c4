"""T5's learned bias per distance bucket, and how the query–key pairs of a window fall into the
buckets at the training length and beyond it (cli.py's doc).

Why it matters for extrapolation: every distance ≥ `max_distance` shares T5's last bucket. When
`max_distance` is not far above the training length L, that bucket holds few training pairs (its
bias is learned from little) but most of the pairs of a window 16× longer, so the model's
behaviour beyond L rests on one rarely-trained number per head.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from poslab.analysis.checkpoints import checkpoint_path
from poslab.errors import ConfigError
from poslab.positions.t5 import t5_bucket

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn, not with this module
    from matplotlib.axes import Axes


def bucket_of_distances(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of every causal distance 0..length−1 (poslab.positions.t5.t5_bucket)."""
    return t5_bucket(torch.arange(length), num_buckets, max_distance).numpy()


def bucket_shares(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """The fraction of the causal query–key pairs of one window of `length` tokens in each
    bucket: distance d occurs for length − d pairs, of length·(length+1)/2 in all."""
    buckets = bucket_of_distances(length, num_buckets, max_distance)
    pairs = length - np.arange(length, dtype=np.float64)
    return np.bincount(buckets, weights=pairs, minlength=num_buckets) / pairs.sum()


def t5_bucket_rows(path: str | Path, factor: float = 16.0) -> list[dict]:
    """One row per bucket of one checkpoint's T5 table: its distances, the bias per head (and
    their mean) and its share of the pairs at L and at factor × L (a ConfigError for a
    checkpoint of another scheme)."""
    from poslab.model.build import load_checkpoint

    ckpt = checkpoint_path(path)
    model, config = load_checkpoint(ckpt)
    pos = model.pos
    if not hasattr(pos, "num_buckets") or not hasattr(pos, "bias"):
        raise ConfigError(f"{path} is not a t5 checkpoint (train with pos=t5)")
    train_length = int(config["data"]["seq_len"])
    long = int(round(factor * train_length))
    table = pos.bias.detach().float()[0].numpy()  # (buckets, heads): the first layer's table
    buckets = bucket_of_distances(long, pos.num_buckets, pos.max_distance)
    at_l = bucket_shares(train_length, pos.num_buckets, pos.max_distance)
    at_long = bucket_shares(long, pos.num_buckets, pos.max_distance)
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    rows = []
    for b in range(pos.num_buckets):
        distances = np.flatnonzero(buckets == b)
        row = {
            "run": run,
            "max_distance": pos.max_distance,
            "seed": config.get("seed"),
            "train_length": train_length,
            "bucket": b,
            "first_distance": int(distances[0]) if len(distances) else None,
            "last_distance": int(distances[-1]) if len(distances) else None,
            "bias_mean": float(table[b].mean()),
            "share_at_L": float(at_l[b]),
            f"share_at_{factor:g}L": float(at_long[b]),
        }
        row.update({f"bias_head{h}": float(v) for h, v in enumerate(table[b])})
        rows.append(row)
    return rows


def plot_t5_buckets(rows: list[dict], factor: float, out: Path, name: str = "t5_buckets") -> None:
    """t5_buckets.png (t5_buckets_figure) and t5_buckets.csv in `out`."""
    from poslab.analysis.figures import save

    save(t5_buckets_figure(rows, factor), rows, out, name)


def _factor_of(rows: list[dict]) -> float:
    """The factor of the rows' `share_at_<factor>L` column (a re-plot from t5_buckets.csv)."""
    key = next(k for k in rows[0] if k.startswith("share_at_") and k != "share_at_L")
    return float(key[len("share_at_") : -1])


def _draw_bias_steps(ax: Axes, rows: list[dict]) -> list[Any]:
    """Each run's learned bias against the distance (bold: the mean over heads; thin: each head),
    in a style of its own; returns the legend's handles."""
    from poslab.plotting import styles_for

    runs = list(dict.fromkeys(r["run"] for r in rows))
    labels = {}
    for run in runs:
        first = next(r for r in rows if r["run"] == run)
        labels[run] = f"max_distance={first['max_distance']}, seed {first['seed']} ({run})"
    styles = styles_for(labels.values())
    handles = []
    for run in runs:
        mine = [r for r in rows if r["run"] == run and r["first_distance"] is not None]
        # a step per bucket over every distance it holds, up to factor × L: the last bucket's
        # one bias spans every distance from max_distance on
        xs = [r["first_distance"] + 1 for r in mine] + [mine[-1]["last_distance"] + 2]
        heads = sorted((k for k in mine[0] if k.startswith("bias_head")), key=lambda k: int(k[9:]))
        style = styles[labels[run]]
        for h in heads:
            ys = [r[h] for r in mine]
            ax.plot(xs, [*ys, ys[-1]], color=style["color"], lw=0.5, alpha=0.35, ds="steps-post")
        means = [r["bias_mean"] for r in mine]
        (line,) = ax.plot(
            xs, [*means, means[-1]], ms=3, label=labels[run], ds="steps-post", **style
        )
        handles.append(line)
    return handles


def _draw_bucket_shares(ax: Axes, rows: list[dict], factor: float) -> list[Any]:
    """The share of query–key pairs per bucket at L and at factor × L, once per max_distance (the
    shares depend only on the bucketing, not on the run): colour = max_distance, marker and dash
    = L or factor × L; returns the legend's handles."""
    from poslab.plotting import COLOURS, MARKERS, dash

    key = f"share_at_{factor:g}L"
    shown: dict[int, list[dict]] = {}
    for r in rows:
        shown.setdefault(r["max_distance"], []).append(r)
    handles = []
    for j, (max_distance, mine) in enumerate(sorted(shown.items())):
        first_run = mine[0]["run"]
        mine = [r for r in mine if r["run"] == first_run and r["first_distance"] is not None]
        xs = [r["first_distance"] + 1 for r in mine]
        for which, (value, where) in enumerate(
            (("share_at_L", f"L={mine[0]['train_length']}"), (key, f"{factor:g}×L"))
        ):
            k = 2 * (j // 10) + which  # (marker, dash) unique per colour
            (line,) = ax.plot(
                xs,
                [r[value] for r in mine],
                color=COLOURS[j % 10],
                marker=MARKERS[k % 9],
                ls=dash(k % 4 if k < 36 else k),
                ms=3,
                label=f"share of pairs, max_distance={max_distance}: at {where}",
            )
            handles.append(line)
    return handles


def _label_bucket_axes(left: Axes, right: Axes, rows: list[dict], factor: float) -> None:
    """Both panels' distance axes (log2, plain numbers, a dotted line at the training length),
    their labels and titles, and the shares' log axis with ticks inside the data."""
    import matplotlib.ticker

    from poslab.plotting import NiceLogLocator, plain_number

    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
        ax.grid(True, which="both", alpha=0.3)
    left.set_xlabel("query–key distance + 1 (tokens); dotted: training length")
    right.set_xlabel("bucket's first distance + 1 (tokens); dotted: training length")
    train_length = rows[0]["train_length"]
    left.axvline(train_length, color="grey", ls=":", lw=1)
    right.axvline(train_length, color="grey", ls=":", lw=1)
    left.set_ylabel("learned bias (logit added)")
    left.set_title(
        f"T5 bias by distance up to {factor:g}×L (bold: mean over heads; thin: each head)"
    )
    right.set_ylabel("share of causal query–key pairs")
    right.set_yscale("log")
    key = f"share_at_{factor:g}L"
    shares = [r[v] for r in rows for v in ("share_at_L", key) if r[v]]
    right.yaxis.set_major_locator(NiceLogLocator(shares))
    right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
    right.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    right.set_title("where a window's pairs fall")


def t5_buckets_figure(rows: list[dict], factor: float | None = None) -> Any:
    """Left: the learned bias (mean over heads; thin: each head) against the distance, a step
    per bucket up to factor × L, one style per run (poslab.plotting: unique for any number of
    runs). Right: the share of query–key pairs per bucket at L and at factor × L, per
    max_distance (colour = max_distance, marker and dash = L or factor × L). `factor`: by
    default the one of the rows' `share_at_<factor>L` column (a re-plot from t5_buckets.csv)."""
    from poslab.plotting import finish_figure, new_figure

    if factor is None:
        factor = _factor_of(rows)
    fig = new_figure(12.5, 4.8)
    left, right = fig.subplots(1, 2)
    handles = _draw_bias_steps(left, rows) + _draw_bucket_shares(right, rows, factor)
    _label_bucket_axes(left, right, rows, factor)
    return finish_figure(fig, handles, [h.get_label() for h in handles])


def run_t5_buckets(out: Path, paths: list[str], factor: float = 16.0) -> list[dict]:
    per_run = [t5_bucket_rows(p, factor) for p in paths]
    if len({rows[0]["run"] for rows in per_run}) < len(per_run):  # sweeps name jobs alike
        for p, rows in zip(paths, per_run, strict=True):
            ckpt = checkpoint_path(p)
            sweep = ckpt.parents[2].name if ckpt.parent.name == "checkpoints" else ckpt.parent.name
            for r in rows:
                r["run"] = f"{sweep}/{r['run']}"
    rows = [r for mine in per_run for r in mine]
    plot_t5_buckets(rows, factor, out)
    return rows
