"""Corpus loading (Hugging Face `datasets`), tokenizers (`tokenizers`), cached token ids, windows.

A corpus is read once through `datasets` (from the hub by id, or from local split files), a
tokenizer is trained on its train split, and every split's token ids are written to a cache folder
keyed by the corpus and tokenizer settings, so a second run starts in seconds (the cache records
a sha256 of each local input file and is rebuilt when their content changes). Local files must be
UTF-8 text, and every split must have some words. Each line ends with an `<eos>` token, as in
WikiText's standard word-level setup.

For tokenizer-independent metrics every split also stores, per token, how many words and UTF-8
bytes of the original text it completes: a line's counts sit on its `<eos>` token, so any set of
scored tokens that covers whole lines sums to the exact word and byte counts.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from poslab.errors import ConfigError
from poslab.sampling import ResumableLoader, run_batches

try:  # POSIX file locks; Windows has none (see _exclusive_lock)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "validation", "test")
# file names accepted for each split in a local folder: ../shared/data layout, then the official
# WikiText release names
SPLIT_FILES = {
    "train": ("train.txt", "wiki.train.tokens"),
    "validation": ("valid.txt", "validation.txt", "wiki.valid.tokens"),
    "test": ("test.txt", "wiki.test.tokens"),
}
TOKENIZERS = ("word", "bpe")
BPE_MIN_VOCAB = 257  # byte-level BPE's initial alphabet (256 bytes) and <eos>
CACHE_VERSION = 4  # 3: word vocabularies renumbered without holes; 4: meta.json has "inputs"


@dataclass
class TokenizedSplit:
    """Token ids of one split, and the words/bytes each token completes (see module doc)."""

    ids: np.ndarray
    words: np.ndarray
    bytes: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def after_line_end(self, eos_id: int) -> TokenizedSplit:
        """The split preceded by one <eos> (no words, no bytes of its own), so that its first
        real token is scored too, predicted from a line end (as fairseq does): the scored
        tokens then carry exactly the split's words and bytes."""
        pad = np.zeros(1, dtype=np.int32)
        return TokenizedSplit(
            np.concatenate([np.full(1, eos_id, dtype=np.int32), np.asarray(self.ids)]),
            np.concatenate([pad, np.asarray(self.words)]),
            np.concatenate([pad, np.asarray(self.bytes)]),
        )

    def head(self, max_tokens: int) -> TokenizedSplit:
        """The first whole lines within `max_tokens` tokens (whole lines keep word and byte
        counts exact)."""
        line_ends = np.flatnonzero(np.asarray(self.words[:max_tokens]) > 0)
        n = int(line_ends[-1]) + 1 if len(line_ends) else min(max_tokens, len(self.ids))
        return TokenizedSplit(self.ids[:n], self.words[:n], self.bytes[:n])


# ---------------------------------------------------------------------------------------------
# reading the corpus


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
        files = local_split_files(path)
        prefix = f"data.path={path}: "
        names = {split: f"{prefix}the {split} file {file}" for split, file in files.items()}
        # hashed before `datasets` reads them: a file changed in between then fails the cache's
        # check next time (a rebuild) rather than passing it with tokens of the old text
        inputs = {
            "files": {
                split: {
                    "path": str(Path(file).resolve()),
                    "sha256": file_sha256(file, names[split]),
                }
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
    elif hub_id is not None:
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
        prefix = ""
        names = {split: f"the {split} split of {hub_id} ({hub_config})" for split in lines}
        # what `datasets` identifies this download by (its fingerprint follows the hub revision
        # and the builder config); recorded, not checked on reuse: see TokenCache.current_inputs
        inputs = {
            "hub_id": hub_id,
            "hub_config": hub_config,
            "fingerprints": {s: getattr(loaded[s], "_fingerprint", None) for s in lines},
        }
    else:
        raise ConfigError("no corpus given: set data.path=DIR (or data.hub_id for the hub)")
    if "validation" not in lines:
        if not 0.0 < valid_fraction < 1.0:
            raise ConfigError(
                "the corpus has no validation split; add valid.txt or set data.valid_fraction "
                "(e.g. 0.05) to hold out the end of train"
            )
        cut = int(len(lines["train"]) * (1.0 - valid_fraction))
        lines["train"], lines["validation"] = lines["train"][:cut], lines["train"][cut:]
        source = names["train"].removeprefix(prefix)
        held_out = f"data.valid_fraction={valid_fraction}"
        names["train"] = f"{prefix}the train split ({source} less its last {held_out})"
        names["validation"] = f"{prefix}the validation split (the last {held_out} of {source})"
    for split, split_lines in lines.items():
        if not any(line.strip() for line in split_lines):  # stops at the first word
            raise ConfigError(
                f"{names[split]} has no words ({len(split_lines)} blank or whitespace-only "
                "lines); give every split some text"
            )
    return Corpus(lines, inputs, names)


def read_corpus(
    hub_id: str | None,
    hub_config: str | None,
    path: str | None,
    cache_dir: str,
    valid_fraction: float = 0.0,
) -> dict[str, list[str]]:
    """Lines of each split, read through `datasets` (local text files or the hub)."""
    return load_corpus(hub_id, hub_config, path, cache_dir, valid_fraction).lines


# ---------------------------------------------------------------------------------------------
# tokenizers


def train_tokenizer(lines: list[str], kind: str, vocab_size: int | None) -> Any:
    """A `tokenizers.Tokenizer`: `word` (whitespace words) or byte-level `bpe`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "word":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordLevelTrainer(
            vocab_size=vocab_size or 100_000_000, min_frequency=0, special_tokens=[UNK, EOS]
        )
    elif kind == "bpe":
        if not vocab_size:
            raise ConfigError("data.tokenizer=bpe needs data.vocab_size (e.g. 8192)")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        raise ConfigError(f"data.tokenizer={kind!r}; choose one of {TOKENIZERS}")
    tokenizer.train_from_iterator(lines, trainer=trainer)
    if kind == "word":
        # the trainer leaves a hole in the ids when a special token is also a corpus word (as
        # WikiText's <unk>): renumber so ids are 0..V-1 and V is the true number of types
        by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        tokenizer.model = models.WordLevel({w: i for i, (w, _) in enumerate(by_id)}, unk_token=UNK)
    return tokenizer


def encode_lines(tokenizer: Any, lines: list[str], chunk: int = 20_000) -> TokenizedSplit:
    """Token ids of all lines, each followed by <eos>, with per-token word and byte counts."""
    eos = tokenizer.token_to_id(EOS)
    ids, words, nbytes = [], [], []
    for start in range(0, len(lines), chunk):
        batch = lines[start : start + chunk]
        for line, enc in zip(batch, tokenizer.encode_batch(batch), strict=True):
            line = line.rstrip("\n")
            n = len(enc.ids)
            ids.append(np.asarray(enc.ids + [eos], dtype=np.int32))
            w = np.zeros(n + 1, dtype=np.int32)
            b = np.zeros(n + 1, dtype=np.int32)
            w[-1] = len(line.split()) + 1  # the words of the line and its end-of-line
            b[-1] = len(line.encode("utf-8")) + 1  # its bytes and the newline
            words.append(w)
            nbytes.append(b)
    if not ids:
        return TokenizedSplit(*(np.zeros(0, dtype=np.int32) for _ in range(3)))
    return TokenizedSplit(np.concatenate(ids), np.concatenate(words), np.concatenate(nbytes))


# ---------------------------------------------------------------------------------------------
# the cache


def _atomic_save(path: Path, write: Any) -> None:
    """Write through a temporary file in the same folder, then rename: a kill never leaves a
    half-written cache file behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would append ".npy" to a name
        np.save(f, array, allow_pickle=False)


@contextlib.contextmanager
def _exclusive_lock(path: Path, what: object) -> Iterator[None]:
    """Hold an exclusive inter-process lock (flock) on the file `path` while the block runs:
    the first process to take it builds the cache, the others wait here until it is done.

    The lock file is never deleted: a process that removed it could let a later one lock a new
    file while an earlier one still holds the old. The lock ends with the process, so a killed
    build never blocks the next run. Where there is no flock (Windows, or a file system that
    refuses it) racing processes each build the cache; the atomic writes keep it intact, so
    that only costs time.
    """
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("another process is building %s; waiting for it", what)
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:  # e.g. an NFS mount without lock support
            log.warning("cannot lock %s (%s); building without a lock", path, err)
        yield  # closing the file releases the lock


def _check_cache_dir(cache_dir: str) -> None:
    """The cache folder, or the nearest of its parents that exists, must be a folder: a file
    there would fail deep in the build with NotADirectoryError."""
    folder = Path(cache_dir).expanduser()
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        what = "a broken symlink" if folder.is_symlink() and not folder.exists() else "a file"
        raise ConfigError(
            f"data.cache_dir={cache_dir}: {folder} is {what}, not a folder; point data.cache_dir "
            "(or POSLAB_CACHE) at a folder"
        )


def _source_identity(hub_id: str | None, hub_config: str | None, path: str | None) -> dict:
    if path is None:
        return {"hub_id": hub_id, "hub_config": hub_config}
    files = local_split_files(path)
    return {
        split: [str(Path(f).resolve()), os.path.getsize(f), int(os.path.getmtime(f))]
        for split, f in sorted(files.items())
    }


class TokenCache:
    """Token ids and tokenizer of one corpus under one tokenizer setting, on disk."""

    def __init__(
        self,
        name: str,
        hub_id: str | None = None,
        hub_config: str | None = None,
        path: str | None = None,
        tokenizer: str = "word",
        vocab_size: int | None = None,
        valid_fraction: float = 0.0,
        cache_dir: str = ".cache/poslab",
    ) -> None:
        if tokenizer not in TOKENIZERS:
            raise ConfigError(f"data.tokenizer={tokenizer!r}; choose one of {TOKENIZERS}")
        if tokenizer == "bpe" and vocab_size is not None and vocab_size < BPE_MIN_VOCAB:
            # the trainer would silently keep its whole byte alphabet: another vocabulary size
            raise ConfigError(
                f"data.vocab_size={vocab_size} is below the {BPE_MIN_VOCAB} tokens byte-level "
                f"BPE starts from (256 bytes and {EOS}); set data.vocab_size ≥ {BPE_MIN_VOCAB} "
                "(e.g. 8192)"
            )
        _check_cache_dir(cache_dir)
        self.settings = dict(
            hub_id=hub_id,
            hub_config=hub_config,
            path=path,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            valid_fraction=valid_fraction,
        )
        key = json.dumps(
            {
                "v": CACHE_VERSION,
                "source": _source_identity(hub_id, hub_config, path),
                "tokenizer": tokenizer,
                "vocab_size": vocab_size,
                "valid_fraction": valid_fraction,
            },
            sort_keys=True,
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        self.cache_dir = str(Path(cache_dir).expanduser())
        self.folder = Path(self.cache_dir) / f"{name}-{tokenizer}-{digest}"
        self._meta: dict | None = None

    @classmethod
    def from_config(cls, data: dict[str, Any], **overrides: Any) -> TokenCache:
        """The cache a run's `data` config trained on (keys that are not TokenCache's own, such
        as seq_len, are ignored)."""
        settings = {**data, **overrides}
        names = [n for n in inspect.signature(cls).parameters if n in settings]
        return cls(**{n: settings[n] for n in names})

    def _file(self, split: str, field: str) -> Path:
        return self.folder / f"{split}.{field}.npy"

    @property
    def complete(self) -> bool:
        return (self.folder / "meta.json").is_file()

    def build(self) -> None:
        """Read, tokenize and write every split (meta.json last: it marks the cache complete)."""
        s = self.settings
        log.info("tokenizing %s into %s", s["path"] or s["hub_id"], self.folder)
        corpus = load_corpus(
            s["hub_id"], s["hub_config"], s["path"], self.cache_dir, s["valid_fraction"]
        )
        tokenizer = train_tokenizer(corpus.lines["train"], s["tokenizer"], s["vocab_size"])
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_save(self.folder / "tokenizer.json", lambda p: tokenizer.save(p))
        # ids, not the count of entries: the trainer may leave a gap (a special token that is
        # also a corpus word, like WikiText's <unk>, is counted twice but stored once)
        vocab_size = max(tokenizer.get_vocab().values()) + 1
        meta = {"settings": s, "inputs": corpus.inputs, "vocab_size": vocab_size, "splits": {}}
        special = [
            i for i in (tokenizer.token_to_id(EOS), tokenizer.token_to_id(UNK)) if i is not None
        ]
        for split, split_lines in corpus.lines.items():
            tokens = encode_lines(tokenizer, split_lines)
            # load_corpus saw words in every split; here none may be left but <unk> (a word
            # vocabulary learned from other text, or one cut to nothing by data.vocab_size)
            if np.isin(tokens.ids, special).all():
                vocab = f" of data.vocab_size={s['vocab_size']}" if s["vocab_size"] else ""
                raise ConfigError(
                    f"{corpus.names[split]} has no token but {UNK} and {EOS}: none of its words "
                    f"is in the vocabulary{vocab} learned from the train split; check that it "
                    "is text of the same corpus" + (", or raise data.vocab_size" if vocab else "")
                )
            for field in ("ids", "words", "bytes"):
                array = getattr(tokens, field)
                _atomic_save(self._file(split, field), lambda p, a=array: _save_npy(p, a))
            meta["splits"][split] = {
                "tokens": len(tokens),
                "words": int(tokens.words.sum()),
                "bytes": int(tokens.bytes.sum()),
            }
        _atomic_save(self.folder / "meta.json", lambda p: Path(p).write_text(json.dumps(meta)))

    def current_inputs(self) -> dict[str, dict[str, str]] | None:
        """split -> {path, sha256} of each local split file as it is now, to check against the
        "inputs" meta.json recorded at build time.

        The folder's key holds each file's size and mtime, which a copy (cp -p) or a rewrite
        within the same second keeps: only the content hash tells such files apart, so it is
        checked on every reuse, not only on build. A cheaper check (say size, mtime_ns and
        ctime) would have to handle racy timestamps as git does; hashing costs ~0.4 s for
        WikiText-103's 540 MB (see file_sha256), next to minutes of training, so it is not
        worth that risk.

        None for a hub corpus: it is identified by hub id and config (in the folder's key);
        its meta.json records the `datasets` fingerprints it was built from, but checking its
        revision would need the network on every run: delete the cache folder to pick up a new
        revision of a hub dataset."""
        if self.settings["path"] is None:
            return None
        files = local_split_files(self.settings["path"])
        return {
            split: {"path": str(Path(file).resolve()), "sha256": file_sha256(file)}
            for split, file in files.items()
        }

    def _checked_meta(self, inputs: Any) -> tuple[dict | None, str | None]:
        """(meta.json, None) if the cache is complete and built from the files `inputs()` (a
        call: the files are hashed only when there is a meta.json to check against); else
        (None, why it cannot be used, or None if it is just not built yet)."""
        try:
            meta = json.loads((self.folder / "meta.json").read_text())
        except FileNotFoundError:
            return None, None
        except ValueError:  # atomic writes make this unlikely, but a torn copy of the folder...
            return None, "its meta.json is not valid JSON"
        current = inputs()
        if current is None:
            return meta, None
        built = meta.get("inputs", {}).get("files", {})
        changed = [
            (current.get(split) or built[split])["path"]
            for split in sorted(set(built) | set(current))
            if built.get(split, {}).get("sha256") != current.get(split, {}).get("sha256")
        ]
        if changed:
            return None, f"the content of {', '.join(changed)} changed since it was built"
        return meta, None

    @property
    def lock_file(self) -> Path:
        """Beside the cache folder, not in it: the folder is created by the build."""
        return Path(self.cache_dir) / f"{self.folder.name}.lock"

    def meta(self) -> dict:
        """Split sizes and vocabulary size; builds the cache first if it is incomplete, or
        rebuilds it if it was built from other contents of the input files. Read once per
        instance (every split() and vocab_size lookup asks for it).

        Only one process builds: whoever takes the lock first (in a DDP run every rank gets
        here when the model is built, before Lightning's prepare_data barrier), while the
        others wait for it and then read the finished cache."""
        if self._meta is None:
            inputs = functools.cache(self.current_inputs)  # hash the files at most once here
            meta, _ = self._checked_meta(inputs)
            if meta is None:
                with _exclusive_lock(self.lock_file, self.folder):
                    # another process may have (re)built it while we waited
                    meta, stale = self._checked_meta(inputs)
                    if meta is None:
                        if stale:
                            log.warning("rebuilding the token cache %s: %s", self.folder, stale)
                            (self.folder / "meta.json").unlink(missing_ok=True)  # incomplete now
                        self.build()
                        meta = json.loads((self.folder / "meta.json").read_text())
            self._meta = meta
        return self._meta

    def split(self, split: str) -> TokenizedSplit:
        meta = self.meta()
        if split not in meta["splits"]:
            raise ConfigError(
                f"the corpus has no {split!r} split (has {sorted(meta['splits'])}); "
                "pick another split"
            )
        arrays = [np.load(self._file(split, f), mmap_mode="r") for f in ("ids", "words", "bytes")]
        return TokenizedSplit(*arrays)

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        self.meta()
        return Tokenizer.from_file(str(self.folder / "tokenizer.json"))


# ---------------------------------------------------------------------------------------------
# training windows and the Lightning data module


class TokenWindows(Dataset):
    """Contiguous, non-overlapping windows: input ids[i·L : i·L+L], target shifted by one."""

    def __init__(self, ids: np.ndarray, seq_len: int, split: str = "train") -> None:
        if len(ids) < seq_len + 1:
            raise ConfigError(
                f"data.seq_len={seq_len} is longer than the {split} split ({len(ids)} tokens); "
                "lower data.seq_len or use a larger corpus"
            )
        self.ids = ids
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        chunk = torch.from_numpy(np.asarray(self.ids[start : start + self.seq_len + 1], np.int64))
        return chunk[:-1], chunk[1:]


def _split_source(meta: dict, split: str) -> tuple[str, str]:
    """(where a split's tokens come from, how to give it more) for an error message."""
    settings = meta.get("settings", {})
    file = meta.get("inputs", {}).get("files", {}).get(split)
    fraction = settings.get("valid_fraction")
    if split == "validation" and fraction and not file:  # held out from the end of train
        return f"the last data.valid_fraction={fraction} of train", "raise data.valid_fraction"
    source = file["path"] if file else str(settings.get("path") or settings.get("hub_id"))
    return source, f"give the {split} split more text"


class LMDataModule(L.LightningDataModule):
    """Train/validation windows of `seq_len` tokens from a cached, tokenized corpus; the corpus
    and tokenizer settings (`corpus`) are TokenCache's arguments."""

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        word_level: bool = False,
        seed: int = 0,
        **corpus: Any,
    ) -> None:
        super().__init__()
        if seq_len < 1 or batch_size < 1:
            raise ConfigError(
                f"data.seq_len={seq_len} and data.batch_size={batch_size} must be ≥ 1"
            )
        self.cache = TokenCache(**corpus)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.word_level = word_level
        self.seed = seed  # fixes the order of training batches (poslab.sampling)

    @property
    def vocab_size(self) -> int:
        return int(self.meta()["vocab_size"])

    def meta(self) -> dict:
        """The token cache's meta.json (built first if need be), checked to give every split
        the model trains or validates on at least one window of data.seq_len tokens: read
        before the Trainer is built, so a short split fails before any work."""
        meta = self.cache.meta()
        for split in ("train", "validation"):
            tokens = meta["splits"].get(split, {}).get("tokens")
            if tokens is not None and tokens < self.seq_len + 1:  # input and shifted target
                source, more = _split_source(meta, split)
                raise ConfigError(
                    f"the {split} split ({source}) has {tokens} tokens, fewer than the "
                    f"data.seq_len={self.seq_len} + 1 of one window; lower data.seq_len to at "
                    f"most {max(tokens - 1, 1)} or {more}"
                )
        return meta

    def prepare_data(self) -> None:
        self.meta()

    def setup(self, stage: str | None = None) -> None:
        self.train_set = TokenWindows(self.cache.split("train").ids, self.seq_len, "train")
        self.val_set = TokenWindows(self.cache.split("validation").ids, self.seq_len, "validation")

    def train_dataloader(self) -> DataLoader:
        """The run's batches in a resumable order (poslab.sampling): one stream of
        max_steps × accumulation batches, starting at the batch the run has reached."""
        # outside a Trainer: one data epoch from the start
        batches = run_batches(
            self.trainer, len(self.train_set), self.batch_size, self.seed,
            untrained_batches=len(self.train_set) // self.batch_size,
        )  # fmt: skip
        return ResumableLoader(
            self.train_set,
            batches,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        sampler = None
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:  # each rank validates its part
            sampler = DistributedSampler(
                self.val_set, trainer.world_size, trainer.global_rank, shuffle=False
            )
        return DataLoader(
            self.val_set,
            batch_size=self.eval_batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
        )
