"""θ_i/θ_i(init) of every rotary frequency of checkpoints trained with a learnable θ (cli.py's
doc); the rows and the plot are the rotary scheme's own (poslab.positions.rope_theta), which it
also writes after training."""

from __future__ import annotations

from pathlib import Path

from poslab.analysis.checkpoints import checkpoint_path, scheme_name
from poslab.errors import ConfigError
from poslab.positions.rope_theta import plot_theta, theta_ratio_rows


def theta_rows(path: str | Path) -> list[dict]:
    """θ_i/θ_i(init) per frequency of one checkpoint (a ConfigError if its θ is fixed)."""
    from poslab.model.build import load_checkpoint

    ckpt = checkpoint_path(path)
    model, config = load_checkpoint(ckpt)
    pos = model.pos
    if not hasattr(pos, "frequencies") or getattr(pos, "theta_param", None) is None:
        raise ConfigError(f"{path} has no learnable θ (train with pos.learnable_theta=true)")
    variant = f"{scheme_name(config)} θ {pos.theta_param}"
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    return theta_ratio_rows(pos, variant, run, config.get("seed"))


def run_theta(out: Path, paths: list[str]) -> list[dict]:
    rows: list[dict] = []
    for p in paths:
        rows += theta_rows(p)
    plot_theta(rows, out)
    return rows
