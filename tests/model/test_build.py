"""poslab/model/build.py: checkpoint paths say what they are and what to pass."""

from __future__ import annotations

import re

import pytest
import torch

from poslab.errors import ConfigError
from poslab.model.build import read_checkpoint


def test_checkpoint_paths_say_what_they_are_and_what_to_pass(bad_corpora, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for folder in (run, run / "checkpoints"):  # what run= takes, and the folder inside it
        with pytest.raises(ConfigError, match=re.escape(f"or run={run} for its best checkpoint")):
            read_checkpoint(folder)
    link = tmp_path / "gone.ckpt"
    link.symlink_to(tmp_path / "nowhere.ckpt")
    with pytest.raises(ConfigError, match=re.escape(f"broken symlink to {tmp_path}/nowhere")):
        read_checkpoint(link)
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, run / "checkpoints" / "best.ckpt")
    last = run / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, last)
    last.write_bytes(last.read_bytes()[:5000])
    with pytest.raises(ConfigError) as err:
        read_checkpoint(last)
    assert "is corrupt or incomplete" in str(err.value)
    assert str(err.value).endswith(f"instead: {run / 'checkpoints' / 'best.ckpt'}")
    with pytest.raises(ConfigError, match="not a zip archive.*copy it again"):
        read_checkpoint(bad_corpora["random"])
    with pytest.raises(ConfigError, match="valid.txt as a checkpoint: it is no file torch.save"):
        read_checkpoint(bad_corpora["short"] / "valid.txt")
    with pytest.raises(ConfigError, match="is not a poslab checkpoint"):
        read_checkpoint(run / "checkpoints" / "best.ckpt")
