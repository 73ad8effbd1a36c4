"""The token cache: every split's token ids (and word and byte counts) and the tokenizer of one
corpus under one tokenizer setting, in a folder keyed by those settings, so that a second run
starts in seconds.

The cache records a sha256 of each local input file and is rebuilt when their content changes.
One process builds it while the others (the ranks of a DDP run) wait on a file lock and read it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from poslab.checks import choice, require
from poslab.data.corpus import file_sha256, load_corpus, local_split_files
from poslab.data.tokens import (
    EOS,
    LEGACY_TOKENIZER,
    TOKENIZER_VERSIONS,
    UNK,
    TokenizedSplit,
    check_tokenizer,
    encode_lines,
    read_tokenizer,
    train_tokenizer,
)
from poslab.errors import ConfigError

try:  # POSIX file locks; Windows has none (see _exclusive_lock)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

CACHE_VERSION = 4  # 3: word vocabularies renumbered without holes; 4: meta.json has "inputs"


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


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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
        tokenizer_json: str | None = None,
        tokenizer_version: int = LEGACY_TOKENIZER,
    ) -> None:
        """`tokenizer_json`: a tokenizer saved by a run (its JSON), used as it is instead of
        one trained on the train split: the ids a checkpoint was trained with, whatever the
        train text is now (a cache folder of its own). `tokenizer_version`: how a word
        vocabulary is trained (tokens.py TOKENIZER_VERSIONS); the default is the legacy 1, what
        a run config written before the key existed means, and the data configs set 2."""
        check_tokenizer(tokenizer, vocab_size)
        if isinstance(tokenizer_version, str) and tokenizer_version.strip().isdigit():
            # data.tokenizer_version='2' (quoted on a command line) names version 2
            tokenizer_version = int(tokenizer_version)
        require("data.tokenizer_version", tokenizer_version, choice(*TOKENIZER_VERSIONS))
        _check_cache_dir(cache_dir)
        self.settings = dict(
            hub_id=hub_id,
            hub_config=hub_config,
            path=path,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            valid_fraction=valid_fraction,
            tokenizer_version=tokenizer_version,
        )
        # version 1 keeps the folders it always had; a later version of a word vocabulary gets
        # its own (BPE is the same in every version)
        newer = tokenizer == "word" and tokenizer_version != LEGACY_TOKENIZER
        key = json.dumps(
            {
                "v": CACHE_VERSION,
                "source": _source_identity(hub_id, hub_config, path),
                "tokenizer": tokenizer,
                "vocab_size": vocab_size,
                "valid_fraction": valid_fraction,
                **({"given_tokenizer": text_sha256(tokenizer_json)} if tokenizer_json else {}),
                **({"tokenizer_version": tokenizer_version} if newer else {}),
            },
            sort_keys=True,
        )
        self.tokenizer_json = tokenizer_json
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
        if self.tokenizer_json is not None:
            tokenizer = read_tokenizer(self.tokenizer_json)
        else:
            tokenizer = train_tokenizer(
                corpus.lines["train"], s["tokenizer"], s["vocab_size"], s["tokenizer_version"]
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        _atomic_save(self.folder / "tokenizer.json", lambda p: tokenizer.save(p))
        # ids, not the count of entries: the trainer may leave a gap (a special token that is
        # also a corpus word, like WikiText's <unk>, is counted twice but stored once)
        vocab_size = max(tokenizer.get_vocab().values()) + 1
        meta = {"settings": s, "inputs": corpus.inputs, "vocab_size": vocab_size, "splits": {}}
        for split, split_lines in corpus.lines.items():
            tokens = encode_lines(tokenizer, split_lines)
            self._check_known_words(tokens, tokenizer, corpus.names[split])
            for field in ("ids", "words", "bytes"):
                array = getattr(tokens, field)
                _atomic_save(self._file(split, field), lambda p, a=array: _save_npy(p, a))
            meta["splits"][split] = {
                "tokens": len(tokens),
                "words": int(tokens.words.sum()),
                "bytes": int(tokens.bytes.sum()),
            }
        _atomic_save(self.folder / "meta.json", lambda p: Path(p).write_text(json.dumps(meta)))

    def _check_known_words(self, tokens: TokenizedSplit, tokenizer: Any, name: str) -> None:
        """load_corpus saw words in every split; here none may be left but <unk> (a word
        vocabulary learned from other text, or one cut to nothing by data.vocab_size)."""
        special = [
            i for i in (tokenizer.token_to_id(EOS), tokenizer.token_to_id(UNK)) if i is not None
        ]
        if np.isin(tokens.ids, special).all():
            vocab_size = self.settings["vocab_size"]
            vocab = f" of data.vocab_size={vocab_size}" if vocab_size else ""
            raise ConfigError(
                f"{name} has no token but {UNK} and {EOS}: none of its words is in the "
                f"vocabulary{vocab} learned from the train split; check that it is text of the "
                "same corpus" + (", or raise data.vocab_size" if vocab else "")
            )

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

    def stale(self) -> str | None:
        """Why the cache on disk no longer matches its input files (None: it matches, or there
        is no cache yet); reads without building."""
        return self._checked_meta(self.current_inputs)[1]

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
        try:
            arrays = self._arrays(split, meta)
        except (ValueError, OSError) as err:  # a file cut short or damaged since it was built
            log.warning(
                "rebuilding the token cache %s: its %s split is damaged (%s)",
                self.folder,
                split,
                err,
            )
            with _exclusive_lock(self.lock_file, self.folder):
                (self.folder / "meta.json").unlink(missing_ok=True)  # incomplete now
                self.build()
            self._meta = None
            arrays = self._arrays(split, self.meta())
        return TokenizedSplit(*arrays)

    def _arrays(self, split: str, meta: dict) -> list[np.ndarray]:
        """The split's ids, words and bytes, each as long as meta.json says (else ValueError)."""
        arrays = [np.load(self._file(split, f), mmap_mode="r") for f in ("ids", "words", "bytes")]
        expected = meta["splits"][split]["tokens"]
        if any(len(a) != expected for a in arrays):
            raise ValueError(f"{[len(a) for a in arrays]} tokens where meta.json says {expected}")
        return arrays

    def tokenizer(self) -> Any:
        self.meta()
        return read_tokenizer((self.folder / "tokenizer.json").read_text())

    def tokenizer_record(self) -> dict[str, Any]:
        """What a run keeps of its tokenizer (in its checkpoints and its folder): the JSON, its
        hash, and the corpus files it was built from (path and sha256 of each split)."""
        meta = self.meta()  # built first
        text = (self.folder / "tokenizer.json").read_text()
        return {"json": text, "sha256": text_sha256(text), "inputs": meta.get("inputs")}


def check_unrecorded_tokenizer(cache: TokenCache, ckpt: Path, asked: bool = False) -> None:
    """A checkpoint from before runs kept their tokenizer is scored with one rebuilt from the
    corpus: right only if the corpus is the one it trained on. Where its files were written
    after the checkpoint (or the token cache shows they changed since it was built), that is
    known to be false: refused, not scored. `asked` (data_path=): the user named the corpus."""
    changed = cache.stale()
    if not changed and not asked and cache.settings["path"]:
        saved = Path(ckpt).stat().st_mtime
        files = local_split_files(cache.settings["path"]).values()
        newer = [str(f) for f in files if Path(f).stat().st_mtime > saved]
        changed = newer and f"{', '.join(newer)} written after the checkpoint"
    if changed:
        raise ConfigError(
            f"{ckpt} holds no record of its tokenizer (it predates poslab keeping one) and its "
            f"corpus changed ({changed}): a tokenizer rebuilt now would give other ids; score it "
            "on the corpus files it was trained on"
        )
    log.warning(
        "%s holds no record of its tokenizer (it predates poslab keeping one): rebuilt from the "
        "corpus, which must be the one it was trained on",
        ckpt,
    )
