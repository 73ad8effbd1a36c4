"""positions/sinusoidal.py: the table against its closed form, the embedding's scale."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.positions.sinusoidal import SinusoidalPositions, sinusoidal_table


def _sinusoidal_reference(positions, d_model: int, base: float = 10000.0) -> torch.Tensor:
    rows = []
    for p in positions:
        row = []
        for j in range(d_model):
            i = j // 2
            angle = p / base ** (2 * i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_table_closed_form(d_model):
    positions = list(range(200)) + [257, 513]
    table = sinusoidal_table(torch.tensor(positions), d_model)
    assert table.shape == (len(positions), d_model)
    assert table.dtype == torch.float32
    ref = _sinusoidal_reference(positions, d_model)
    torch.testing.assert_close(table.double(), ref, atol=1e-5, rtol=0)


def test_sinusoidal_table_custom_base():
    positions = list(range(50))
    table = sinusoidal_table(torch.tensor(positions), 12, base=100.0)
    torch.testing.assert_close(
        table.double(), _sinusoidal_reference(positions, 12, base=100.0), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(("scale", "expected_scale"), [(None, 1 / math.sqrt(24)), (2.5, 2.5)])
def test_sinusoidal_embed_adds_scaled_table(scale, expected_scale):
    torch.manual_seed(6)
    scheme = SinusoidalPositions(24, 4, scale=scale)
    x = torch.randn(2, 6, 24)
    positions = list(range(3, 9))
    out = scheme.embed(x, torch.tensor(positions))
    expected = x.double() + expected_scale * _sinusoidal_reference(positions, 24)[None]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
