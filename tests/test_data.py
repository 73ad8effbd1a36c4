"""Corpus loading through `datasets` (local files), tokenizers, the token cache, windows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WIKITEXT2, make_corpus

from poslab.data import LMDataModule, TokenCache, TokenWindows, local_split_files, read_corpus
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
    other = TokenCache("toy", path=str(corpus), tokenizer="bpe", vocab_size=300,
                       cache_dir=str(tmp_path))  # fmt: skip
    assert other.folder != cache.folder  # keyed by tokenizer settings


def test_incomplete_cache_is_rebuilt(corpus, tmp_path):
    cache = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    cache.meta()
    (cache.folder / "meta.json").unlink()  # as if killed before the cache was complete
    fresh = TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path))
    assert not fresh.complete
    assert fresh.meta()["splits"]["train"]["tokens"] > 0 and fresh.complete


def test_bpe_tokenizer_keeps_exact_word_and_byte_counts(corpus, tmp_path):
    cache = TokenCache("toy", path=str(corpus), tokenizer="bpe", vocab_size=300,
                       cache_dir=str(tmp_path))  # fmt: skip
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
    for ours, official in (("train.txt", "wiki.train.tokens"), ("valid.txt", "wiki.valid.tokens"),
                           ("test.txt", "wiki.test.tokens")):  # fmt: skip
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
    """The standard WikiText-2 word-level setup: 33,278 types, 2,088,628 training tokens."""
    cache = TokenCache("wikitext2", path=str(WIKITEXT2), cache_dir=os.environ["POSLAB_CACHE"])
    meta = cache.meta()
    assert meta["vocab_size"] == 33278
    assert meta["splits"]["train"]["tokens"] == 2088628
    assert meta["splits"]["validation"]["tokens"] == 217646
    assert meta["splits"]["test"]["tokens"] == 245569
    assert meta["splits"]["validation"]["bytes"] == (WIKITEXT2 / "valid.txt").stat().st_size
