"""positions/learned.py: the table and positions beyond it."""

from __future__ import annotations

import pytest
import torch
from models import tiny_gpt, tokens

from poslab.errors import ConfigError
from poslab.positions.learned import LearnedPositions


def test_learned_beyond_table_error():
    scheme = LearnedPositions(16, 2, max_positions=8)
    x = torch.zeros(1, 9, 16)
    out = scheme.embed(x[:, :8], torch.arange(8))  # the whole table is fine
    assert torch.equal(out[0], scheme.table.weight.detach())
    with pytest.raises(ConfigError, match=r"pos\.max_positions"):
        scheme.embed(x, torch.arange(9))
    with pytest.raises(ConfigError, match=r"pos\.max_positions"):
        scheme.embed(x[:, :1], torch.tensor([100]))


def test_learned_beyond_table_clamp_reuses_last_row():
    torch.manual_seed(8)
    scheme = LearnedPositions(16, 2, max_positions=8, beyond_table="clamp")
    x = torch.randn(2, 5, 16)
    out = scheme.embed(x, torch.tensor([2, 7, 8, 20, 1000]))
    table = scheme.table.weight.detach()
    torch.testing.assert_close(out[:, 0], x[:, 0] + table[2])
    for t in (1, 2, 3, 4):
        torch.testing.assert_close(out[:, t], x[:, t] + table[7])


def test_learned_bad_beyond_table_value():
    with pytest.raises(ConfigError, match="beyond_table"):
        LearnedPositions(16, 2, max_positions=8, beyond_table="wrap")


def test_learned_model_rejects_positions_beyond_table():
    model = tiny_gpt("learned")  # max_positions = 64
    with pytest.raises(ConfigError, match=r"pos\.max_positions"):
        model(tokens(1, 8), positions=torch.arange(60, 68))
