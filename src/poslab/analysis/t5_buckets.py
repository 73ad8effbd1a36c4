"""T5's learned bias per distance bucket, and how the query–key pairs of a window fall into the
buckets at the training length and beyond it (cli.py's doc).

Why it matters for extrapolation: every distance ≥ `max_distance` shares T5's last bucket. When
`max_distance` is not far above the training length L, that bucket holds few training pairs (its
bias is learned from little) but most of the pairs of a window 16× longer, so the model's
behaviour beyond L rests on one rarely-trained number per head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from poslab.analysis.checkpoints import checkpoint_path
from poslab.errors import ConfigError
from poslab.positions.t5 import t5_bucket


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
    from poslab.build import load_checkpoint

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
    """Left: the learned bias (mean over heads; thin: each head) against the bucket's first
    distance, one colour per run. Right: the share of query–key pairs per bucket at L and at
    factor × L, per max_distance."""
    import matplotlib.pyplot as plt

    from poslab.analysis.figures import save

    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), layout="constrained")
    runs = list(dict.fromkeys(r["run"] for r in rows))
    colours = plt.get_cmap("tab10").colors
    markers = ("o", "s", "^", "D", "v", "P")
    for i, run in enumerate(runs):
        mine = [r for r in rows if r["run"] == run and r["first_distance"] is not None]
        xs = [r["first_distance"] + 1 for r in mine]
        heads = sorted(k for k in mine[0] if k.startswith("bias_head"))
        colour = colours[i % 10]
        for h in heads:
            left.plot(xs, [r[h] for r in mine], color=colour, lw=0.5, alpha=0.35)
        label = f"max_distance={mine[0]['max_distance']}, seed {mine[0]['seed']}"
        left.plot(
            xs,
            [r["bias_mean"] for r in mine],
            color=colour,
            marker=markers[i // 10 % len(markers)],
            ms=3,
            ls=("-", "--", ":")[i // 10 % 3],
            label=label,
        )
    key = f"share_at_{factor:g}L"
    shown = {}
    for r in rows:  # the shares depend only on the bucketing, not on the run
        shown.setdefault(r["max_distance"], []).append(r)
    for j, (max_distance, mine) in enumerate(sorted(shown.items())):
        first_run = mine[0]["run"]
        mine = [r for r in mine if r["run"] == first_run and r["first_distance"] is not None]
        xs = [r["first_distance"] + 1 for r in mine]
        colour = colours[j % 10]
        right.plot(
            xs,
            [r["share_at_L"] for r in mine],
            color=colour,
            marker="o",
            ms=3,
            label=f"max_distance={max_distance}: at L={mine[0]['train_length']}",
        )
        right.plot(
            xs,
            [r[key] for r in mine],
            color=colour,
            marker="s",
            ms=3,
            ls="--",
            label=f"max_distance={max_distance}: at {factor:g}×L",
        )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bucket's first distance + 1 (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    train_length = rows[0]["train_length"]
    left.axvline(train_length, color="grey", ls=":", lw=1)
    right.axvline(train_length, color="grey", ls=":", lw=1)
    left.set_ylabel("learned bias (logit added)")
    left.set_title("T5 bias per bucket (bold: mean over heads; thin: each head)")
    right.set_ylabel("share of causal query–key pairs")
    right.set_yscale("log")
    right.set_title("where a window's pairs fall (dotted: training length)")
    left.legend(fontsize=7, loc="lower left")
    right.legend(fontsize=7, loc="lower left")
    save(fig, rows, out, name)


def run_t5_buckets(out: Path, paths: list[str], factor: float = 16.0) -> list[dict]:
    rows: list[dict] = []
    for p in paths:
        rows += t5_bucket_rows(p, factor)
    plot_t5_buckets(rows, factor, out)
    return rows
