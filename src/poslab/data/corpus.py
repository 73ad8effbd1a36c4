"""Reading a corpus: local split files (checked to be UTF-8 text with some words) or a dataset
of the Hugging Face hub, both through `datasets`.

Local files are hashed (sha256) in the same pass that checks them: the token cache records the
hashes and is rebuilt when a file's content changes (cache.py).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError

SPLITS = ("train", "validation", "test")
# file names accepted for each split in a local folder: ../shared/data layout, then the official
# WikiText release names
SPLIT_FILES = {
    "train": ("train.txt", "wiki.train.tokens"),
    "validation": ("valid.txt", "validation.txt", "wiki.valid.tokens"),
    "test": ("test.txt", "wiki.test.tokens"),
}


def local_split_files(path: str | Path) -> dict[str, str]:
    """Map split -> file in a local folder; `path` may also be a single text file (train only)."""
    root = Path(path).expanduser()
    if not root.exists():
        problem = _not_a_text_file(root)
        if problem:  # a broken symlink: "does not exist" would hide where it points
            raise ConfigError(f"data.path={problem}; point it at a folder of split files")
        raise ConfigError(f"data.path={path} does not exist; point it at a folder of split files")
    if root.is_file():
        return {"train": str(root)}
    if not root.is_dir():
        raise ConfigError(
            f"data.path={_not_a_text_file(root)}; point it at a folder of split files"
        )
    files = {}
    for split, names in SPLIT_FILES.items():
        odd = None  # the first name that is there but is no file (a folder, a broken link)
        for name in names:
            if (root / name).is_file():
                files[split] = str(root / name)
                break
            odd = odd or _not_a_text_file(root / name)
        if split not in files and odd:
            # said as it is: "has no validation split; add valid.txt" would mislead
            raise ConfigError(
                f"data.path={path}: {odd}; replace it with the {split} split's text file"
            )
    if "train" not in files:
        raise ConfigError(
            f"data.path={path} has no train split; expected one of {SPLIT_FILES['train']}"
        )
    for split, file in files.items():
        if os.path.getsize(file) == 0:
            raise ConfigError(
                f"data.path={path}: the {split} file {file} is empty; give it the {split} "
                "split's text"
            )
    return files


def _not_a_text_file(path: Path) -> str | None:
    """What `path` is when a name is there but no file can be read through it (a folder, a
    broken symlink, a device); None for a file or nothing at all."""
    if path.is_file() or not os.path.lexists(path):
        return None
    if path.is_symlink() and not path.exists():
        return f"{path} is a broken symlink to {os.readlink(path)}"
    if path.is_dir():
        return f"{path} is a directory, not a text file"
    return f"{path} is a device, pipe or socket, not a text file"


# Files are read in chunks of this size when they are checked and hashed: measured fastest for
# the UTF-8 check (the decoded chunk stays in the CPU cache; 1 MiB chunks are ~3x slower).
_READ_CHUNK = 1 << 17


def _line_of(file: str | Path, offset: int) -> int:
    """The line number of byte `offset` of `file` (counted only when an error is reported, so
    the check itself stays one pass)."""
    line = 1
    with open(file, "rb") as f:
        while offset > 0 and (chunk := f.read(min(_READ_CHUNK, offset))):
            line += chunk.count(b"\n")
            offset -= len(chunk)
    return line


def file_sha256(file: str | Path, check_text: str | None = None) -> str:
    """sha256 of a file, read in chunks (never whole). With `check_text` (how to name the file
    in an error, e.g. "data.path=X: the train file X/train.txt") it also checks, in the same
    pass, that the file is UTF-8 text: a NUL byte (binary data, UTF-16) or bytes that are not
    UTF-8 are a ConfigError naming the file, not a UnicodeDecodeError deep inside `datasets`.

    Cost measured on a 2-core VM, page-cached WikiText-2 train.txt (10.8 MB): 7.5 ms to hash
    (sha256 runs on the CPU's SHA extensions through OpenSSL), 13 ms to hash and check, i.e.
    ~0.4 s and ~0.65 s for WikiText-103's 540 MB (blake2b: 14 ms, slower here)."""
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")() if check_text else None
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    offset = 0
    try:
        with open(file, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
                if check_text:
                    _check_text_chunk(file, check_text, buffer, n, offset, decoder)
                offset += n
        if check_text:
            _check_text_chunk(file, check_text, buffer, 0, offset, decoder)
    except OSError as err:
        raise ConfigError(
            f"{check_text or file}: cannot read {file} ({err.strerror or err}); fix its "
            "permissions or point data.path elsewhere"
        ) from None
    return digest.hexdigest()


def _check_text_chunk(
    file: str | Path, who: str, buffer: bytearray, n: int, offset: int, decoder: Any
) -> None:
    """One step of file_sha256's UTF-8 check: buffer[:n] holds the file's bytes from `offset`
    on; n = 0 ends the file."""
    if offset == 0 and buffer[: min(n, 2)] in (b"\xff\xfe", b"\xfe\xff"):
        raise ConfigError(
            f"{who} is UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8; "
            "convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)"
        )
    nul = buffer.find(b"\0", 0, n)
    if nul >= 0:
        at = offset + nul
        raise ConfigError(
            f"{who} is binary, not text (a NUL byte at offset {at}, line "
            f"{_line_of(file, at)}); data.path must hold UTF-8 text files"
        )
    pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
    try:
        decoder.decode(memoryview(buffer)[:n], final=n == 0)
    except UnicodeDecodeError as err:
        at = offset - pending + err.start
        problem = (
            f"byte 0x{err.object[err.start]:02x} at offset {at}"
            if n
            else f"it ends inside a multi-byte character at offset {at}"
        )
        raise ConfigError(
            f"{who} is not UTF-8 text ({problem}, line {_line_of(file, at)}); convert it to "
            "UTF-8 (e.g. iconv -f latin1 -t utf-8 for Latin-1 text)"
        ) from None


@dataclass
class Corpus:
    """The lines of each split, what they were read from (with checksums: the cache's
    meta.json "inputs"), and how to name each split in an error message."""

    lines: dict[str, list[str]]
    inputs: dict[str, Any]
    names: dict[str, str]


def load_corpus(
    hub_id: str | None,
    hub_config: str | None,
    path: str | None,
    cache_dir: str,
    valid_fraction: float = 0.0,
) -> Corpus:
    """Read every split through `datasets` (local text files or the hub), after checking that
    local files are UTF-8 text; a split with no words (only blank lines) is a ConfigError."""
    import datasets

    datasets.disable_progress_bars()
    if path is not None:
        corpus, prefix = _read_local(path, cache_dir), f"data.path={path}: "
    elif hub_id is not None:
        corpus, prefix = _read_hub(hub_id, hub_config, cache_dir), ""
    else:
        raise ConfigError("no corpus given: set data.path=DIR (or data.hub_id for the hub)")
    if "validation" not in corpus.lines:
        one_file = path is not None and Path(path).expanduser().is_file()
        _hold_out_validation(corpus, valid_fraction, prefix, one_file)
    _check_every_split_has_words(corpus)
    return corpus


def _read_local(path: str, cache_dir: str) -> Corpus:
    """The split files of `path`, checked to be UTF-8 text and hashed, then read by `datasets`."""
    import datasets

    files = local_split_files(path)
    names = {split: f"data.path={path}: the {split} file {file}" for split, file in files.items()}
    # hashed before `datasets` reads them: a file changed in between then fails the cache's
    # check next time (a rebuild) rather than passing it with tokens of the old text
    inputs = {
        "files": {
            split: {"path": str(Path(file).resolve()), "sha256": file_sha256(file, names[split])}
            for split, file in files.items()
        }
    }
    # a throwaway `datasets` cache: its own would key these files by path and mtime, and
    # hand back the old text of a file rewritten with its mtime kept (cp -p, os.utime)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=cache_dir, prefix=".hf-", ignore_cleanup_errors=True
    ) as hf_tmp:
        loaded = datasets.load_dataset("text", data_files=files, cache_dir=hf_tmp)
        lines = {split: list(loaded[split]["text"]) for split in SPLITS if split in loaded}
        del loaded
    return Corpus(lines, inputs, names)


def _read_hub(hub_id: str, hub_config: str | None, cache_dir: str) -> Corpus:
    """A dataset of the Hugging Face hub; unreachable, it is a ConfigError that says to pass
    local files instead."""
    import datasets

    try:
        loaded = datasets.load_dataset(
            hub_id, hub_config, cache_dir=os.path.join(cache_dir, "hf_datasets")
        )
    except Exception as err:  # connection errors come in many types across versions
        raise ConfigError(
            f"could not load {hub_id} ({hub_config}) from the Hugging Face hub "
            f"({type(err).__name__}); offline? pass data.path=DIR with train.txt, valid.txt, "
            "test.txt"
        ) from None
    lines = {split: list(loaded[split]["text"]) for split in SPLITS if split in loaded}
    names = {split: f"the {split} split of {hub_id} ({hub_config})" for split in lines}
    # what `datasets` identifies this download by (its fingerprint follows the hub revision
    # and the builder config); recorded, not checked on reuse: see TokenCache.current_inputs
    inputs = {
        "hub_id": hub_id,
        "hub_config": hub_config,
        "fingerprints": {s: getattr(loaded[s], "_fingerprint", None) for s in lines},
    }
    return Corpus(lines, inputs, names)


def _hold_out_validation(
    corpus: Corpus, valid_fraction: float, prefix: str, one_file: bool = False
) -> None:
    """Make the last `valid_fraction` of train the validation split of a corpus that has none
    (renaming both splits for error messages); without a fraction, a ConfigError."""
    if not 0.0 < valid_fraction < 1.0 and one_file:
        # "add valid.txt" to a file would mislead (#43)
        raise ConfigError(
            f"{prefix}one text file is read as the train split only; set data.valid_fraction "
            "(e.g. 0.05) to hold out its end for validation, or point data.path at the folder "
            "of train.txt and valid.txt"
        )
    if not 0.0 < valid_fraction < 1.0:
        raise ConfigError(
            "the corpus has no validation split; add valid.txt or set data.valid_fraction "
            "(e.g. 0.05) to hold out the end of train"
        )
    lines, names = corpus.lines, corpus.names
    cut = int(len(lines["train"]) * (1.0 - valid_fraction))
    lines["train"], lines["validation"] = lines["train"][:cut], lines["train"][cut:]
    source = names["train"].removeprefix(prefix)
    held_out = f"data.valid_fraction={valid_fraction}"
    names["train"] = f"{prefix}the train split ({source} less its last {held_out})"
    names["validation"] = f"{prefix}the validation split (the last {held_out} of {source})"


def _check_every_split_has_words(corpus: Corpus) -> None:
    for split, split_lines in corpus.lines.items():
        if not any(line.strip() for line in split_lines):  # stops at the first word
            raise ConfigError(
                f"{corpus.names[split]} has no words ({len(split_lines)} blank or "
                "whitespace-only lines); give every split some text"
            )


def read_corpus(
    hub_id: str | None,
    hub_config: str | None,
    path: str | None,
    cache_dir: str,
    valid_fraction: float = 0.0,
) -> dict[str, list[str]]:
    """Lines of each split, read through `datasets` (local text files or the hub)."""
    return load_corpus(hub_id, hub_config, path, cache_dir, valid_fraction).lines
