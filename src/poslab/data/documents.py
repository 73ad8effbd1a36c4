"""Per-document evaluation (`eval.documents=PATH`): a corpus of long documents scored one
document at a time, as jquesnelle/yarn scores proof-pile, not as one stream.

At each eval length N, every document with at least N tokens is one window: its first N tokens,
at positions 0..N−1, the first one predicted from the start token (a poslab run's `<eos>`, the
line end its stream evaluation also starts from; a pretrained model's BOS, else EOS). That is
yarn's window (BOS and the document) with the prediction at its last position scored too, so N
tokens are scored per document, as in a stream window of N. A document shorter than N is left
out at N (each row counts the documents it scored), so the perplexity at 16k is that of 16k-token
documents, never of short ones laid end to end. With `eval.max_documents=K` each length scores
the first K documents (in the source's order) that are long enough for it. The set thus shrinks
as N grows; `eval.min_document_tokens=M` (yarn's --dataset-min-tokens) keeps only documents of
at least M tokens, so with M = the longest length every length scores the same documents.

Sources, each document in a stated, stable order:

* a folder: every `*.txt` file directly in it (hidden files aside) is one document, in file-name
  order;
* a `.txt` file: every line with text is one document, in line order;
* a `.jsonl` file: every line with text is a JSON object whose `"text"` is one document (as
  `datasets`' `to_json` writes proof-pile or pg19), in line order.

A document's lines are tokenized as the evaluated model reads a corpus (poslab: each line and
its `<eos>`; a pretrained model: the lines with their newlines, no special tokens). Words and
UTF-8 bytes are counted per token here, not per line: a word on the token holding its last
character, a byte on the token holding its character, a line end (one word, one byte) on the
token holding the newline (poslab: the line's `<eos>`). Any prefix then carries the words it
completes and its bytes, and a whole document the counts a stream split gives it
(data/tokens.py), so word-level perplexity and bits per byte hold for a prefix cut mid-line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from poslab.data.tokens import EOS, TokenizedSplit
from poslab.errors import ConfigError

SUFFIXES = (".txt", ".jsonl")
WHAT = (
    "a folder of .txt files (one document each), a .txt file (one document per line) or a "
    '.jsonl file (one JSON object per line, the document in "text")'
)
WORD = re.compile(r"\S+")  # str.split()'s words: \S is what str.isspace() is not
# documents tokenized per call: enough for a fast tokenizer's batch, few enough to stop soon
# once eval.max_documents long documents are found
BATCH = 32

Encode = Callable[[list[str]], list[TokenizedSplit]]


def document_files(folder: Path) -> list[Path]:
    """The documents of a folder: its *.txt files (not hidden ones), in file-name order."""
    return sorted(
        p for p in folder.iterdir() if p.suffix == ".txt" and p.is_file() and p.name[0] != "."
    )


def check_source(setting: Any) -> Path:
    """The file or folder eval.documents names, checked without reading every document: it
    exists, a folder holds a .txt file, a file is a non-empty .txt or .jsonl, and a .jsonl's
    first record has a "text". Each problem is one ConfigError saying what to change."""
    key = f"eval.documents={setting}"
    path = Path(str(setting)).expanduser()
    if not path.exists():
        raise ConfigError(f"{key} does not exist; point it at {WHAT}")
    if path.is_dir():
        if not document_files(path):
            raise ConfigError(f"{key} holds no .txt file; point it at {WHAT}")
        return path
    if not path.is_file() or path.suffix not in SUFFIXES:
        raise ConfigError(
            f"{key} is neither a folder nor a .txt or .jsonl file; point it at {WHAT}"
        )
    if path.stat().st_size == 0:
        raise ConfigError(f"{key} is empty; give it one document per line")
    if path.suffix == ".jsonl":
        next(read_documents(path, key), None)  # the first record: a JSON object with a "text"
    return path


def read_documents(source: Path, key: str) -> Iterator[tuple[str, str]]:
    """(name, text) of each document with text in `source`, in order; a file that is not UTF-8
    text, or a .jsonl line that is not a JSON object with a string "text", is a ConfigError."""
    if source.is_dir():
        for file in document_files(source):
            text = _checked_text(_read(file, key), file, key)
            if text.strip():
                yield file.name, text
        return
    jsonl = source.suffix == ".jsonl"
    with open(source, encoding="utf-8") as f:
        lines = enumerate(f, 1)
        while True:
            try:
                number, line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as err:
                raise ConfigError(
                    f"{key} is not UTF-8 text ({err.reason}); convert it to UTF-8 (e.g. iconv "
                    "-f latin1 -t utf-8 for Latin-1 text)"
                ) from None
            line = _checked_text(line, source, key, number).rstrip("\n")
            if not line.strip():
                continue
            text = _record_text(line, number, key) if jsonl else line
            if text.strip():
                yield f"line {number}", text


def _read(file: Path, key: str) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{key}: {file.name} is not UTF-8 text ({err.reason} at byte {err.start}); convert "
            "it to UTF-8 or remove it"
        ) from None


def _checked_text(text: str, file: Path, key: str, line: int | None = None) -> str:
    if "\0" in text:  # a binary file (or UTF-16) decodes as UTF-8 but is no text
        where = f"line {line} of {file.name}" if line else file.name
        raise ConfigError(
            f"{key}: {where} holds a NUL byte (binary data or UTF-16, not UTF-8 text); "
            "documents must be UTF-8 text"
        )
    return text


def _record_text(line: str, number: int, key: str) -> str:
    """The "text" of one .jsonl line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{key}: line {number} is not JSON ({err.msg}); a .jsonl file holds one JSON object "
            'per line, the document in "text"'
        ) from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        kind = type(record).__name__
        has = f"its fields are {sorted(record)[:5]}" if isinstance(record, dict) else f"a {kind}"
        raise ConfigError(
            f'{key}: line {number} has no "text" string ({has}); write each document as '
            '{"text": "..."} (or give a .txt file with one document per line)'
        )
    return text


# tokens, and the words and bytes each token completes


def document_lines(text: str) -> list[str]:
    """The lines of a document; a final newline ends the last line (no empty line after it)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def token_counts(text: str, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The words and UTF-8 bytes each token of `text` completes (see the module doc), given
    where each token starts in `text` (in characters). `text` is the document as read, each
    line ending in a newline."""
    n = len(starts)
    starts = np.maximum.accumulate(np.asarray(starts, dtype=np.int64))  # sorted, for the search
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    # the token holding character c: the last one starting at or before it
    holder = np.clip(np.searchsorted(starts, np.arange(len(codes)), side="right") - 1, 0, n - 1)
    utf8 = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    nbytes = np.bincount(holder, weights=utf8, minlength=n)
    ends = [m.end() - 1 for m in WORD.finditer(text)]
    ends += np.flatnonzero(codes == ord("\n")).tolist()  # a line end is a word, as in WikiText
    words = np.bincount(holder[np.asarray(ends, dtype=np.int64)], minlength=n)
    return words.astype(np.int32), nbytes.astype(np.int32)


def encoder_of_run(tokenizer: Any) -> Encode:
    """Documents as a poslab run reads text (`tokenizers`): each line's tokens and its <eos>."""
    eos = tokenizer.token_to_id(EOS)

    def encode(texts: list[str]) -> list[TokenizedSplit]:
        out = []
        for text in texts:
            lines = document_lines(text)
            ids: list[int] = []
            starts: list[int] = []
            offset = 0
            for line, enc in zip(lines, tokenizer.encode_batch(lines), strict=True):
                ids += [*enc.ids, eos]
                starts += [offset + s for s, _ in enc.offsets] + [offset + len(line)]
                offset += len(line) + 1
            out.append(_split(ids, "".join(line + "\n" for line in lines), starts))
        return out

    return encode


def encoder_of_pretrained(tokenizer: Any) -> Encode:
    """Documents as pretrained.encode_text reads a corpus: the lines with their newlines, no
    special tokens."""

    def encode(texts: list[str]) -> list[TokenizedSplit]:
        read = ["".join(line + "\n" for line in document_lines(t)) for t in texts]
        # verbose=False: a document longer than the model's context is the point, not a warning
        enc = tokenizer(read, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [
            _split(ids, text, [s for s, _ in offsets])
            for ids, text, offsets in zip(
                enc["input_ids"], read, enc["offset_mapping"], strict=True
            )
        ]

    return encode


def _split(ids: list[int], text: str, starts: list[int]) -> TokenizedSplit:
    if not ids:
        return TokenizedSplit(*(np.zeros(0, dtype=np.int32) for _ in range(3)))
    words, nbytes = token_counts(text, np.asarray(starts))
    return TokenizedSplit(np.asarray(ids, dtype=np.int32), words, nbytes)


# the documents of one evaluation


@dataclass
class Documents:
    """The documents read for one evaluation, tokenized, in the source's order."""

    setting: str  # eval.documents as given
    names: list[str]
    tokens: list[TokenizedSplit]
    start_id: int  # the token each document's first token is predicted from
    max_documents: int | None
    min_tokens: int  # eval.min_document_tokens (0: none)
    read_all: bool  # False: reading stopped once the longest length had max_documents

    @property
    def longest(self) -> int:
        return max(len(t) for t in self.tokens)

    def chosen(self, length: int) -> list[int]:
        """The documents scored at `length`: those with at least `length` tokens (and
        eval.min_document_tokens), the first eval.max_documents of them."""
        need = max(length, self.min_tokens)
        long_enough = [i for i, t in enumerate(self.tokens) if len(t) >= need]
        return long_enough[: self.max_documents] if self.max_documents else long_enough

    def prefixes(self, chosen: list[int], length: int) -> tuple[TokenizedSplit, list[int]]:
        """The start token and the first `length` tokens of each chosen document, laid end to
        end, and where each such window starts: window k's targets are document k's tokens."""
        block = length + 1
        arrays = [np.zeros(len(chosen) * block, dtype=np.int32) for _ in range(3)]
        ids, words, nbytes = arrays
        ids[::block] = self.start_id  # the start token carries no words or bytes
        for k, i in enumerate(chosen):
            at = slice(k * block + 1, (k + 1) * block)
            doc = self.tokens[i]
            ids[at], words[at], nbytes[at] = (a[:length] for a in (doc.ids, doc.words, doc.bytes))
        return TokenizedSplit(ids, words, nbytes), [k * block for k in range(len(chosen))]

    def summary(self, lengths: list[int]) -> str:
        """One line for the console: what was read and how many documents each length scores."""
        read = "" if self.read_all else f" (read until {self.max_documents} reach every length)"
        per_length = ", ".join(f"{n}: {len(self.chosen(n))}" for n in lengths)
        return (
            f"eval.documents={self.setting}: {len(self.tokens)} documents{read}, the longest "
            f"{self.longest:,} tokens; documents scored per length: {per_length}"
        )


def load_documents(
    setting: str,
    max_documents: int | None,
    lengths: list[int],
    encode: Encode,
    start_id: int,
    min_tokens: int | None = None,
) -> Documents:
    """The documents of eval.documents, tokenized by `encode`; with max_documents, reading stops
    once that many reach the longest length (every length then has its K). No document as long
    as the shortest length (and min_tokens) is a ConfigError: there would be nothing to score."""
    key = f"eval.documents={setting}"
    min_tokens = min_tokens or 0
    longest = max(*lengths, min_tokens)
    source = check_source(setting)
    names: list[str] = []
    tokens: list[TokenizedSplit] = []
    batch: list[tuple[str, str]] = []
    reach_all, read_all = 0, True
    documents = read_documents(source, key)
    for item in documents:
        batch.append(item)
        if len(batch) < BATCH:
            continue
        reach_all += _add(batch, encode, names, tokens, longest)
        batch = []
        if max_documents and reach_all >= max_documents:
            read_all = next(documents, None) is None
            break
    documents.close()  # reading stopped early: the file is closed now, not when collected
    if batch:
        _add(batch, encode, names, tokens, longest)
    if not tokens:
        raise ConfigError(f"{key} holds no document with text; point it at {WHAT}")
    found = Documents(setting, names, tokens, start_id, max_documents, min_tokens, read_all)
    need = max(min(lengths), min_tokens)
    if found.longest < need:
        what = (
            f"eval.min_document_tokens={min_tokens}"
            if min_tokens > min(lengths)
            else "the shortest eval length"
        )
        raise ConfigError(
            f"{key}: no document has {need:,} tokens, {what} (the longest of its {len(tokens)} "
            f"has {found.longest:,} with this model's tokenizer); give longer documents or "
            "shorter eval.lengths" + (" or a lower eval.min_document_tokens" if min_tokens else "")
        )
    return found


def _add(
    batch: list[tuple[str, str]],
    encode: Encode,
    names: list[str],
    tokens: list[TokenizedSplit],
    longest: int,
) -> int:
    """Tokenize a batch of documents into names/tokens; how many reach `longest` tokens."""
    encoded = encode([text for _, text in batch])
    names += [name for name, _ in batch]
    tokens += encoded
    return sum(len(t) >= longest for t in encoded)
