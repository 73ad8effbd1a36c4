"""A researcher's own schemes, outside the package: `POSLAB_USER=DIR` (several folders joined by
the path separator, ":" on Linux) names folders that each hold `conf/pos/<name>.yaml` and the
module its `_target_` names (`myscheme.py` for `_target_: myscheme.Mine`).

Why an environment variable, not a Hydra search path on each command or a package entry point:
one setting reaches every tool at once (train, eval, `-m` sweeps, the study driver's job
processes, compare, `poslab-check-scheme`), a shell or a SLURM job passes it on without a flag,
and the user's folder needs no packaging. Hydra sees the folders through the search path plugin
in hydra_plugins/poslab_user/, and the scheme registry (poslab.positions) lists their schemes
beside the shipped ones.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from poslab.errors import ConfigError

ENV = "POSLAB_USER"


def user_folders() -> list[Path]:
    """The folders POSLAB_USER names, each checked to hold conf/; [] when it is unset."""
    folders = []
    for part in os.environ.get(ENV, "").split(os.pathsep):
        if not part.strip():
            continue
        folder = Path(part).expanduser().resolve()
        if not (folder / "conf" / "pos").is_dir():
            raise ConfigError(
                f"{ENV}={part}: {folder / 'conf' / 'pos'} is not a folder; point {ENV} at a "
                "folder holding conf/pos/<name>.yaml and the scheme's module (docs/own-scheme.md)"
            )
        folders.append(folder)
    return folders


def activate() -> list[Path]:
    """The user's folders, put on sys.path so that their `_target_`s import (idempotent)."""
    folders = user_folders()
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return folders


def user_scheme_files(shipped: set[str]) -> dict[str, Path]:
    """name -> conf/pos/<name>.yaml of the user's folders; a name that shadows a shipped
    scheme or appears in two folders is refused (one scheme per name, whatever the order)."""
    found: dict[str, Path] = {}
    for folder in activate():
        for path in sorted((folder / "conf" / "pos").glob("*.yaml")):
            name = path.stem
            if name in shipped:
                raise ConfigError(
                    f"{ENV}: {path} shadows poslab's scheme {name!r}; rename the file (the "
                    "scheme's name is its file name)"
                )
            if name in found:
                raise ConfigError(
                    f"{ENV}: scheme {name!r} is in {found[name]} and {path}; keep one"
                )
            found[name] = path
    return found
