"""Corpus loading through `datasets` (local files), tokenizers, the token cache, windows."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WIKITEXT2, copy_corpus, make_corpus

from poslab.data.cache import TokenCache
from poslab.data.corpus import file_sha256, local_split_files, read_corpus
from poslab.data.text import LMDataModule, TokenWindows
from poslab.errors import ConfigError


def corpus_counts(path: Path) -> tuple[int, int]:
    """(words incl. one end-of-line per line, bytes) of a text file, computed directly."""
    lines = path.read_text().split("\n")[:-1]
    return sum(len(x.split()) + 1 for x in lines), path.stat().st_size


def test_word_tokenizer_cache_matches_the_text(corpus, tmp_path):
    cache = TokenCache("toy", path=str(corpus), tokenizer="word", cache_dir=str(tmp_path))
    meta = cache.meta()
    for split, name in (("train", "train.txt"), ("validation", "valid.txt"), ("test", "test.txt")):
        words, nbytes = corpus_counts(corpus / name)
        data = cache.split(split)
        assert meta["splits"][split] == {"tokens": words, "words": words, "bytes": nbytes}
        assert int(data.words.sum()) == words and int(data.bytes.sum()) == nbytes
    tok = cache.tokenizer()
    ids = cache.split("validation").ids
    eos = tok.token_to_id("<eos>")
    first_line = (corpus / "valid.txt").read_text().split("\n")[0].split()
    assert [tok.id_to_token(int(i)) for i in ids[: len(first_line)]] == first_line
    assert ids[len(first_line)] == eos
    assert int(np.max(ids)) < meta["vocab_size"]


def test_second_load_uses_the_cache(corpus, tmp_path):
    cache = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    cache.meta()
    stamp = {p: p.stat().st_mtime_ns for p in cache.folder.iterdir()}
    again = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    assert again.folder == cache.folder and again.complete
    np.testing.assert_array_equal(again.split("train").ids, cache.split("train").ids)
    assert {p: p.stat().st_mtime_ns for p in again.folder.iterdir()} == stamp
    other = TokenCache(
        "toy", path=str(corpus), tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path)
    )
    assert other.folder != cache.folder  # keyed by tokenizer settings


def test_incomplete_cache_is_rebuilt(corpus, tmp_path):
    cache = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    cache.meta()
    (cache.folder / "meta.json").unlink()  # as if killed before the cache was complete
    fresh = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    assert not fresh.complete
    assert fresh.meta()["splits"]["train"]["tokens"] > 0 and fresh.complete


def test_bpe_tokenizer_keeps_exact_word_and_byte_counts(corpus, tmp_path):
    cache = TokenCache(
        "toy", path=str(corpus), tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path)
    )
    meta = cache.meta()
    words, nbytes = corpus_counts(corpus / "valid.txt")
    assert meta["splits"]["validation"]["words"] == words
    assert meta["splits"]["validation"]["bytes"] == nbytes
    assert meta["vocab_size"] <= 300
    ids = cache.split("validation").ids
    assert int(np.max(ids)) < meta["vocab_size"]
    text = cache.tokenizer().decode([int(i) for i in ids[:40]])
    assert "the" in text


def test_official_wikitext_file_names_are_accepted(tmp_path):
    src = make_corpus(tmp_path / "a", n_train=5, n_valid=3)
    dst = tmp_path / "b"
    dst.mkdir()
    for ours, official in (
        ("train.txt", "wiki.train.tokens"),
        ("valid.txt", "wiki.valid.tokens"),
        ("test.txt", "wiki.test.tokens"),
    ):
        (dst / official).write_bytes((src / ours).read_bytes())
    files = local_split_files(dst)
    assert sorted(files) == ["test", "train", "validation"]
    lines = read_corpus(None, None, str(dst), str(tmp_path / "c"))
    assert lines["validation"] == (src / "valid.txt").read_text().split("\n")[:-1]


def test_single_file_with_valid_fraction(tmp_path):
    src = make_corpus(tmp_path / "a", n_train=100, n_valid=3)
    lines = read_corpus(None, None, str(src / "train.txt"), str(tmp_path / "c"), 0.1)
    assert len(lines["validation"]) == 11 and len(lines["train"]) == 91
    with pytest.raises(ConfigError, match="data.valid_fraction"):
        read_corpus(None, None, str(src / "train.txt"), str(tmp_path / "c"), 0.0)


def test_missing_or_empty_data_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        local_split_files(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no train split"):
        local_split_files(tmp_path / "empty")
    (tmp_path / "empty" / "train.txt").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        local_split_files(tmp_path / "empty")


def test_binary_train_file_is_one_clear_error(corpus, tmp_path):
    data = copy_corpus(corpus, tmp_path / "data")
    train = data / "train.txt"
    train.write_bytes(b"the a1 n1\nthe \x00\x01\x02 n2\n")
    with pytest.raises(ConfigError) as err:
        read_corpus(None, None, str(data), str(tmp_path / "c"))
    message = str(err.value)
    assert "\n" not in message and f"the train file {train} is binary" in message
    assert "NUL byte at offset 14, line 2" in message
    # the same file as data.path itself (a single train file), through the cache
    with pytest.raises(
        ConfigError, match=re.escape(f"data.path={train}: the train file {train} is binary")
    ):
        TokenCache("bin", path=str(train), valid_fraction=0.1, cache_dir=str(tmp_path)).meta()


def test_file_that_is_not_utf8_is_one_clear_error(corpus, tmp_path):
    data = copy_corpus(corpus, tmp_path / "data")
    valid = data / "valid.txt"
    valid.write_bytes(" the café n1 .\n the n2 .\n".encode("latin-1"))  # é is byte 0xe9
    with pytest.raises(ConfigError) as err:
        TokenCache("latin1", path=str(data), cache_dir=str(tmp_path)).meta()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"data.path={data}: the validation file {valid} is not UTF-8")
    assert "(byte 0xe9 at offset 8, line 1)" in message and "iconv" in message
    valid.write_text("the n1 .\n", encoding="utf-16")  # NUL bytes, but text: say which
    with pytest.raises(ConfigError, match=re.escape(f"the validation file {valid} is UTF-16 text")):
        read_corpus(None, None, str(data), str(tmp_path / "c"))


def test_utf8_check_follows_characters_across_read_chunks(tmp_path):
    import poslab.data.corpus

    chunk = poslab.data.corpus._READ_CHUNK
    text = tmp_path / "text.txt"
    # a 3-byte character cut by the chunk boundary is fine...
    text.write_bytes(b"a" * (chunk - 1) + "€\n".encode() + b"b\n")
    assert file_sha256(text, "it") == hashlib.sha256(text.read_bytes()).hexdigest()
    # ...a bad byte after one is reported at its offset in the file...
    text.write_bytes(b"a\n" * (chunk // 2 - 1) + b"a" + "€".encode() + b"\xff\n")
    with pytest.raises(ConfigError, match=rf"byte 0xff at offset {chunk + 2}, line {chunk // 2}\)"):
        file_sha256(text, "it")
    # ...and so is a character the file ends inside
    text.write_bytes(b"abc\n" + "€".encode()[:2])
    with pytest.raises(ConfigError, match="ends inside a multi-byte character at offset 4, line 2"):
        file_sha256(text, "it")


@pytest.mark.parametrize("blank", [" \n\n  \n", "\t\n \u3000 \n"])
def test_split_with_only_blank_lines_is_one_clear_error(blank, corpus, tmp_path):
    data = copy_corpus(corpus, tmp_path / "data")
    valid = data / "valid.txt"
    valid.write_text(blank, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        TokenCache(
            "blank", path=str(data), tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path)
        ).meta()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"data.path={data}: the validation file {valid} has no words")


def test_held_out_validation_with_no_words_names_where_it_comes_from(tmp_path):
    single = tmp_path / "corpus.txt"
    single.write_text(" the n1 v1 .\n" * 20 + " \n" * 5)  # the last 10% are blank
    where = f"the validation split (the last data.valid_fraction=0.1 of the train file {single})"
    with pytest.raises(ConfigError, match=re.escape(f"{where} has no words")):
        read_corpus(None, None, str(single), str(tmp_path / "c"), 0.1)


def test_split_of_only_unknown_words_is_one_clear_error(corpus, tmp_path):
    data = copy_corpus(corpus, tmp_path / "data")
    test = data / "test.txt"
    test.write_text(" zebra yak \n\n gnu .x \n")  # not one word of train's
    with pytest.raises(
        ConfigError, match=re.escape(f"the test file {test} has no token but <unk>")
    ):
        TokenCache("unk", path=str(data), cache_dir=str(tmp_path)).meta()
    with pytest.raises(ConfigError, match=r"the train file .* raise data\.vocab_size"):
        TokenCache("unk", path=str(corpus), vocab_size=2, cache_dir=str(tmp_path)).meta()


def test_cache_is_rebuilt_when_a_file_changes_with_size_and_mtime_kept(corpus, tmp_path, caplog):
    data = copy_corpus(corpus, tmp_path / "data")
    valid = data / "valid.txt"
    cache = TokenCache("same-stat", path=str(data), cache_dir=str(tmp_path / "cache"))
    meta = cache.meta()
    assert meta["inputs"]["files"]["validation"]["sha256"] == file_sha256(valid)
    old_ids = np.array(cache.split("validation").ids)
    # same size, same mtime, other text (as cp -p of another file, or a rewrite within a second)
    stat = valid.stat()
    text = valid.read_text()
    changed = text.replace(" the ", " a10 ", 1)  # a10 is a word of train, as long as `the`
    assert len(changed) == len(text) and changed != text
    valid.write_text(changed)
    os.utime(valid, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (valid.stat().st_size, valid.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)

    again = TokenCache("same-stat", path=str(data), cache_dir=str(tmp_path / "cache"))
    assert again.folder == cache.folder and again.complete  # same key: size and mtime agree
    with caplog.at_level(logging.INFO, logger="poslab.data"):
        new_meta = again.meta()
    assert (
        f"rebuilding the token cache {again.folder}: the content of {valid.resolve()} "
        "changed" in caplog.text
    )
    assert "tokenizing" in caplog.text
    assert new_meta["inputs"]["files"]["validation"]["sha256"] == file_sha256(valid)
    # the new text is what was tokenized (not the old one, from `datasets`' own cache)
    tok = again.tokenizer()
    new_ids = np.array(again.split("validation").ids)
    eos = tok.token_to_id("<eos>")
    assert [tok.id_to_token(int(i)) for i in new_ids if i != eos] == changed.split()
    assert len(new_ids) == len(old_ids) and (new_ids != old_ids).sum() == 1
    # and once rebuilt, it is reused as it is
    caplog.clear()
    stamp = {p: p.stat().st_mtime_ns for p in again.folder.iterdir()}
    third = TokenCache("same-stat", path=str(data), cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="poslab.data"):
        assert third.meta() == new_meta
    assert "tokenizing" not in caplog.text and "rebuilding" not in caplog.text
    assert {p: p.stat().st_mtime_ns for p in third.folder.iterdir()} == stamp


def test_cache_without_input_checksums_is_rebuilt(corpus, tmp_path, caplog):
    """A meta.json with other checksums (or none) never passes for these files."""
    cache = TokenCache("old", path=str(corpus), cache_dir=str(tmp_path))
    meta = cache.meta()
    del meta["inputs"]
    (cache.folder / "meta.json").write_text(json.dumps(meta))
    again = TokenCache("old", path=str(corpus), cache_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="poslab.data"):
        assert again.meta()["inputs"]["files"]["train"]["sha256"] == file_sha256(
            corpus / "train.txt"
        )
    assert "rebuilding the token cache" in caplog.text


def test_windows_are_contiguous_and_shifted():
    ids = np.arange(50, dtype=np.int32)
    windows = TokenWindows(ids, seq_len=8)
    assert len(windows) == 6
    x, y = windows[2]
    assert torch.equal(x, torch.arange(16, 24)) and torch.equal(y, torch.arange(17, 25))
    with pytest.raises(ConfigError, match="data.seq_len=64 is longer than the train split"):
        TokenWindows(ids, seq_len=64)


def test_datamodule_batches(corpus, tmp_path):
    dm = LMDataModule(
        seq_len=16, batch_size=4, name="toy", path=str(corpus), cache_dir=str(tmp_path)
    )
    dm.prepare_data()
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 16) and y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert dm.vocab_size == int(dm.cache.meta()["vocab_size"])


@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/wikitext-2 not present")
def test_real_wikitext2_word_level_matches_the_standard_counts(tmp_path):
    """The standard WikiText-2 word-level setup: 33,278 types, 2,088,628 training tokens, each
    type at its own id (data.tokenizer_version=2: <eos> apart from "the", <unk> from "and")."""
    cache = TokenCache(
        "wikitext2", path=str(WIKITEXT2), cache_dir=os.environ["POSLAB_CACHE"], tokenizer_version=2
    )
    meta = cache.meta()
    assert meta["vocab_size"] == 33278
    vocab = cache.tokenizer().get_vocab()
    assert len(vocab) == len(set(vocab.values())) == 33278
    ids = cache.split("validation").ids
    lines = (WIKITEXT2 / "valid.txt").read_text().count("\n")
    assert int((ids == vocab["<eos>"]).sum()) == lines
    assert meta["splits"]["train"]["tokens"] == 2088628
    assert meta["splits"]["validation"]["tokens"] == 217646
    assert meta["splits"]["test"]["tokens"] == 245569
    assert meta["splits"]["validation"]["bytes"] == (WIKITEXT2 / "valid.txt").stat().st_size


def test_a_token_file_cut_short_is_rebuilt_not_a_traceback(corpus, tmp_path):
    """validation.ids.npy cut to 1,000 bytes gave a 75-line trace ending in `mmap length is
    greater than file size` (#43); a cut meta.json was already rebuilt."""
    cache = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    before = np.array(cache.split("validation").ids)
    ids = cache.folder / "validation.ids.npy"
    ids.write_bytes(ids.read_bytes()[:1000])
    again = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    assert np.array_equal(np.array(again.split("validation").ids), before)
    assert ids.stat().st_size > 1000


# a corpus whose text holds a special token as a word, as WikiText's <unk> (the trainer then
# leaves a hole in the ids, which the vocabulary is renumbered to close)
SPECIAL_IN_TEXT = ["the cat sat", "the dog <unk> ran", "a b c the the", "a <unk> cat"]


def test_the_word_vocabulary_gives_every_token_its_own_id():
    """data.tokenizer_version=2: <eos>, the text's <unk> and every word at distinct ids, the
    same in memory as read back from its JSON (what a run records and an export writes)."""
    from tokenizers import Tokenizer

    from poslab.data.tokens import EOS, UNK, encode_lines, train_tokenizer

    tokenizer = train_tokenizer(SPECIAL_IN_TEXT, "word", None, version=2)
    vocab = tokenizer.get_vocab()
    assert len(set(vocab.values())) == len(vocab) == 10  # 8 words, <unk>, <eos>
    assert sorted(vocab.values()) == list(range(10))  # no hole
    reread = Tokenizer.from_str(tokenizer.to_str())
    ids = encode_lines(tokenizer, SPECIAL_IN_TEXT).ids
    assert list(ids) == list(encode_lines(reread, SPECIAL_IN_TEXT).ids)
    eos, unk, the = (tokenizer.token_to_id(t) for t in (EOS, UNK, "the"))
    assert len({eos, unk, the}) == 3
    assert int((ids == eos).sum()) == len(SPECIAL_IN_TEXT)  # one per line end
    assert int((ids == unk).sum()) == 2  # the text's two <unk>
    assert tokenizer.encode("zebra").ids == [unk]  # an unknown word


def test_version_1_keeps_its_merged_ids_and_reads_back_as_its_cache_encodes():
    """data.tokenizer_version=1 (runs before the fix) put <eos> at the id of a word; its cache
    holds those ids, and read_tokenizer reads its JSON so that it encodes them again."""
    from tokenizers import Tokenizer

    from poslab.data.tokens import EOS, encode_lines, legacy_merges, read_tokenizer, train_tokenizer

    legacy = train_tokenizer(SPECIAL_IN_TEXT, "word", None, version=1)
    cache_ids = list(encode_lines(legacy, SPECIAL_IN_TEXT).ids)
    eos = legacy.token_to_id(EOS)
    assert eos == legacy.token_to_id("the")  # the merge, kept on purpose for old runs
    text = legacy.to_str()
    assert legacy_merges(text)
    assert list(encode_lines(Tokenizer.from_str(text), SPECIAL_IN_TEXT).ids) != cache_ids
    assert list(encode_lines(read_tokenizer(text), SPECIAL_IN_TEXT).ids) == cache_ids
    fixed = train_tokenizer(SPECIAL_IN_TEXT, "word", None, version=2).to_str()
    assert legacy_merges(fixed) == {}


def test_the_cache_folder_follows_the_tokenizer_version_of_word_vocabularies(corpus, tmp_path):
    """Version 1 keeps the folders caches always had (old runs find theirs); version 2 of a
    word vocabulary has its own; BPE is the same in both. A config without the key is 1."""
    base = {"path": str(corpus), "cache_dir": str(tmp_path)}
    word = {v: TokenCache("toy", **base, tokenizer_version=v).folder for v in (1, 2)}
    assert word[1] == TokenCache("toy", **base).folder and word[1] != word[2]
    bpe = {
        v: TokenCache("toy", **base, tokenizer="bpe", vocab_size=300, tokenizer_version=v)
        for v in (1, 2)
    }
    assert bpe[1].folder == bpe[2].folder
    assert TokenCache.from_config({"name": "toy", **base}).settings["tokenizer_version"] == 1
    with pytest.raises(ConfigError, match="data.tokenizer_version=3"):
        TokenCache("toy", **base, tokenizer_version=3)
    # quoted on a command line (data.tokenizer_version='2'): version 2, not "not one of 1, 2"
    assert TokenCache("toy", **base, tokenizer_version="2").folder == word[2]


def test_a_composed_run_config_uses_the_fixed_vocabulary(tmp_path):
    from conftest import compose_train

    cfg = compose_train(["pos=rope"], tmp_path)
    assert cfg.data.tokenizer_version == 2
