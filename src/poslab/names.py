"""Names of things on disk that the config resolvers need before anything heavy is imported."""

from __future__ import annotations

from pathlib import Path


def pretrained_name(source: str) -> str:
    """A pretrained model's name in tables: `HuggingFaceTB/SmolLM-135M` -> `SmolLM-135M`, a
    folder -> its name."""
    return Path(str(source).rstrip("/")).name or str(source)


def pretrained_folder(source: str) -> Path:
    """Where eval.py hf=SOURCE writes without out_dir: outputs/pretrained/<name>/."""
    import re

    slug = re.sub(r"[^A-Za-z0-9._]+", "-", pretrained_name(source)).strip("-.") or "model"
    return Path("outputs") / "pretrained" / slug
