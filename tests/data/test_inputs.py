"""Bad corpora said as they are: a split file that is a folder, a broken symlink, a device or
empty; a split shorter than data.seq_len; token cache settings that cannot work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SHORT_VALID, make_corpus

from poslab.data.cache import TokenCache
from poslab.data.corpus import local_split_files
from poslab.data.text import LMDataModule
from poslab.errors import ConfigError


def test_split_files_that_are_no_text_files_are_named_as_they_are(bad_corpora, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"{bad_corpora['vdir']}/valid.txt is a dir")):
        local_split_files(bad_corpora["vdir"])
    with pytest.raises(ConfigError, match=re.escape(f"broken symlink to {bad_corpora['missing']}")):
        local_split_files(bad_corpora["vlink"])
    with pytest.raises(ConfigError, match=re.escape(f"{bad_corpora['tdir']}/train.txt is a dir")):
        local_split_files(bad_corpora["tdir"])
    with pytest.raises(ConfigError, match="train.txt is empty; give it the train split's text"):
        local_split_files(bad_corpora["tempty"])
    device = make_corpus(tmp_path / "device", n_train=20, n_valid=5)
    (device / "valid.txt").unlink()
    (device / "valid.txt").symlink_to("/dev/null")
    with pytest.raises(ConfigError, match="valid.txt is a device, pipe or socket"):
        local_split_files(device)
    # a folder named like a split beside a real file of another accepted name: the file is used
    (device / "valid.txt").unlink()
    (device / "valid.txt").mkdir()
    (device / "validation.txt").write_text(SHORT_VALID)
    assert local_split_files(device)["validation"] == str(device / "validation.txt")


def test_a_split_shorter_than_seq_len_is_found_when_the_data_is_loaded(bad_corpora, tmp_path):
    def data(seq_len: int, path: Path, **options: object) -> LMDataModule:
        return LMDataModule(
            seq_len, batch_size=4, name="short", path=str(path), cache_dir=str(tmp_path), **options
        )

    # vocab_size is what training reads before it builds the Trainer
    with pytest.raises(ConfigError, match=r"\(.*short/valid.txt\) has 8 tokens, fewer than"):
        data(512, bad_corpora["short"]).vocab_size  # noqa: B018
    held_out = data(64, bad_corpora["short"] / "train.txt", valid_fraction=0.001)
    with pytest.raises(ConfigError, match=r"valid_fraction=0.001 of train\) has \d+ tokens.*rai"):
        held_out.vocab_size  # noqa: B018
    assert data(7, bad_corpora["short"]).vocab_size > 2  # one window of 7 + 1 tokens fits


def test_token_cache_settings_that_cannot_work_fail_at_once(corpus, tmp_path):
    with pytest.raises(ConfigError, match=re.escape("data.vocab_size=100 is below the 257")):
        TokenCache(
            "toy", path=str(corpus), tokenizer="bpe", vocab_size=100, cache_dir=str(tmp_path)
        )
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'file'} is a file, not a fold")):
        TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path / "file" / "cache"))
