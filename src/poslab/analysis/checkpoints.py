"""Finding a checkpoint from a path, and naming its scheme: what the analyses of trained
checkpoints (attention, theta) share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.errors import ConfigError


def checkpoint_path(path: str | Path) -> Path:
    """A .ckpt file as given, or the best (else last) checkpoint of a run folder (as
    poslab.evaluation.run.checkpoint_of_run, whose module imports Lightning: seconds that a
    mistyped path should not wait for)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (p / "checkpoints" / name).is_file():
                return p / "checkpoints" / name
        raise ConfigError(
            f"run folder {p} has no checkpoints/best.ckpt or last.ckpt; pass a .ckpt file "
            "or a run folder whose training saved a checkpoint"
        )
    raise ConfigError(
        f"no such checkpoint or run folder: {p}; pass .ckpt files or run folders holding "
        "checkpoints/best.ckpt or last.ckpt"
    )


def scheme_name(config: dict[str, Any]) -> str:
    from poslab.evaluation.plan import scheme_label

    return scheme_label(config)
