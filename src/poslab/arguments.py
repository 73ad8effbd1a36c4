"""The command-line scripts' arguments (scripts/compare.py, benchmark.py, analysis.py): usage
errors and unwritable output paths as one `error: ...` line with exit code 2, before any work.

On the ground floor (it imports only errors), so every script and package CLI can use it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from poslab.errors import ConfigError


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number ≥ `minimum` (else argparse's one-line error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum} (got {value})")
        return value

    return parse


def a_path(text: str) -> str:
    """An argparse `type`: a path that is not empty. `""` (an unset shell variable in
    `--out "$DIR"`) would be Path("") = the current folder, or for an option read as
    `args.out or default`, the default: neither is what was typed."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty (an unset variable?); pass a path")
    return text


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are a ConfigError, so that `exit_on_config_error` prints
    them as one `error: ...` line with exit code 2 (argparse's own: usage + error, 2 lines)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        invoked = Path(sys.argv[0]).name  # an installed console script: poslab-runs, ...
        help_command = f"{invoked} --help" if invoked.startswith("poslab-") else None
        raise ConfigError(f"{message}; see {help_command or f'python {self.prog} --help'}")


def write_problem(folder: Path) -> str | None:
    """Why no file can be created in the existing `folder` (a file created and removed at once:
    permissions, a read-only or special file system, all answer), else None."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".poslab-write-check-")
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    os.unlink(name)
    return None


def check_writable(path: str | Path, option: str, folder: bool = True) -> None:
    """A ConfigError (naming `option`) unless `path` can be written as a folder (`folder=False`:
    as a file): it is one already, or the nearest folder above it that exists is one where this
    process can create files. Nothing is left: the entry points make their output folders only
    once they have something to write, so that a failure leaves nothing behind."""
    path = Path(path)
    kind = "folder" if folder else "file"
    try:
        if path.exists():
            if path.is_dir() != folder:
                what = "a folder" if path.is_dir() else "a file"
                raise ConfigError(f"{option} {path} is {what}; pass the path of a {kind}")
            problem = write_problem(path) if folder else None
            if problem is None and (folder or os.access(path, os.W_OK)):
                return
            raise ConfigError(
                f"{option} {path}: cannot write there ({problem or 'no write permission'}); "
                f"pass a {kind} you can write"
            )
        above = path.absolute().parent
        while not above.exists():  # exists() is False under a file too (ENOTDIR)
            above = above.parent
        if not above.is_dir():
            raise ConfigError(
                f"{option} {path}: {above} is a file, so no {kind} can be made under it; pass a "
                "path outside it"
            )
        problem = write_problem(above)
        if problem:
            raise ConfigError(
                f"{option} {path}: cannot create it, {above} is not writable ({problem}); pass "
                f"a {kind} you can write"
            )
    except OSError as err:  # a permission error on the way up, a name too long, ...
        raise ConfigError(f"{option} {path}: {err.strerror or err}; pass another path") from None
