"""Tokenizers (`tokenizers`): whitespace words or byte-level BPE, trained on the train split, and
the token ids of a split's lines.

Each line ends with an `<eos>` token, as in WikiText's standard word-level setup. For
tokenizer-independent metrics every split also stores, per token, how many words and UTF-8 bytes
of the original text it completes: a line's counts sit on its `<eos>` token, so any set of scored
tokens that covers whole lines sums to the exact word and byte counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from poslab.checks import choice, integer, require
from poslab.errors import ConfigError

EOS = "<eos>"
UNK = "<unk>"
TOKENIZERS = ("word", "bpe")
# data.tokenizer_version, for word vocabularies (BPE is the same in both):
#   1: the vocabulary renumbered without holes kept its special tokens at their ids from before
#      the renumbering, so where a special token is also a corpus word (WikiText's <unk>) every
#      <eos> got the id of one word ("the" on WikiText) and the text's <unk> that of another
#      ("and"): two pairs of types merged. Every result made before 2026-11-28 used it; a run
#      config without the key means it, so those runs keep their ids.
#   2: special tokens at their ids in the renumbered vocabulary (the data configs' default).
TOKENIZER_VERSIONS = (1, 2)
LEGACY_TOKENIZER = 1
BPE_MIN_VOCAB = 257  # byte-level BPE's initial alphabet (256 bytes) and <eos>


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


def check_tokenizer(kind: str, vocab_size: int | None) -> None:
    """The tokenizer settings (data.tokenizer, data.vocab_size) that no tokenizer can be
    trained with, found before any text is read."""
    require("data.tokenizer", kind, choice(*TOKENIZERS))
    require("data.vocab_size", vocab_size, integer(2, null=True))
    if kind == "bpe" and vocab_size is not None and vocab_size < BPE_MIN_VOCAB:
        # the trainer would silently keep its whole byte alphabet: another vocabulary size
        raise ConfigError(
            f"data.vocab_size={vocab_size} is below the {BPE_MIN_VOCAB} tokens byte-level "
            f"BPE starts from (256 bytes and {EOS}); set data.vocab_size ≥ {BPE_MIN_VOCAB} "
            "(e.g. 8192)"
        )


def train_tokenizer(
    lines: list[str], kind: str, vocab_size: int | None, version: int = LEGACY_TOKENIZER
) -> Any:
    """A `tokenizers.Tokenizer`: `word` (whitespace words) or byte-level `bpe`; `version`: see
    TOKENIZER_VERSIONS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check_tokenizer(kind, vocab_size)
    if kind == "word":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordLevelTrainer(
            vocab_size=vocab_size or 100_000_000, min_frequency=0, special_tokens=[UNK, EOS]
        )
    else:
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
    tokenizer.train_from_iterator(lines, trainer=trainer)
    if kind == "word":
        # the trainer leaves a hole in the ids when a special token is also a corpus word (as
        # WikiText's <unk>): renumber so ids are 0..V-1 and V is the true number of types
        by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        vocab = {w: i for i, (w, _) in enumerate(by_id)}
        if version == LEGACY_TOKENIZER:  # the special tokens keep their old ids (see above)
            tokenizer.model = models.WordLevel(vocab, unk_token=UNK)
            return tokenizer
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.add_special_tokens([UNK, EOS])  # at their ids in `vocab`
    return tokenizer


# the name a legacy vocabulary's out-of-vocabulary words go by once its text <unk> has the id
# version 1 gave it (read_tokenizer)
LEGACY_OOV = "<unk:oov>"


def legacy_merges(text: str) -> dict[str, int]:
    """The special tokens a version-1 word vocabulary (its JSON) kept at ids its renumbered
    vocabulary gives to other words: token -> the id its cache holds it at ({}: none merged)."""
    import json

    spec = json.loads(text)
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "WordLevel" or not isinstance(vocab, dict):
        return {}
    return {
        t["content"]: t["id"]
        for t in spec.get("added_tokens") or []
        if t["content"] in vocab and vocab[t["content"]] != t["id"]
    }


def read_tokenizer(text: str) -> Any:
    """A tokenizer from its JSON, encoding as it did when it was written. A version-1 word
    vocabulary (TOKENIZER_VERSIONS) kept special tokens at ids its renumbered vocabulary gives to
    other words; in memory the special ids won, so its token cache holds them (every <eos> as
    the id of "the" on WikiText), but read back from JSON the vocabulary's ids win. Such a
    vocabulary is read here with the special tokens' ids put back, so it encodes the text as
    its cache does: the text's special tokens and token_to_id at their version-1 ids, unknown
    words at the vocabulary's <unk> id. (Two words at one id do not survive a second save.)"""
    import json

    from tokenizers import Tokenizer

    merged = legacy_merges(text)
    if not merged:
        return Tokenizer.from_str(text)
    spec = json.loads(text)
    model = spec["model"]
    unk = model.get("unk_token")
    if unk in merged:  # unknown words keep the vocabulary's <unk> id, under another name
        model["vocab"][LEGACY_OOV] = model["vocab"][unk]
        model["unk_token"] = LEGACY_OOV
    model["vocab"].update(merged)
    return Tokenizer.from_str(json.dumps(spec))


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
