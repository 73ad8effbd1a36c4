"""positions/kerple.py: the log and power kernels against the paper's formulas."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.positions.kerple import Kerple

D_MODEL, N_HEAD = 32, 4


def test_kerple_log_and_power_formulas():
    for variant in ("log", "power"):
        scheme = Kerple(D_MODEL, N_HEAD, variant=variant)
        with torch.no_grad():
            scheme.r1.copy_(torch.tensor([[0.5, 1.0, 2.0, 3.0]]))
            scheme.r2.copy_(torch.tensor([[0.5, 1.0, 1.5, 5.0]]))  # 5.0: power clamps it to 2
        bias = scheme.attention_bias(torch.tensor([10]), torch.tensor([10, 7, 0]))[:, 0]
        for h, (r1, r2) in enumerate([(0.5, 0.5), (1.0, 1.0), (2.0, 1.5), (3.0, 5.0)]):
            for j, d in enumerate([0, 3, 10]):
                want = -r1 * math.log(1 + r2 * d) if variant == "log" else -r1 * d ** min(r2, 2)
                assert bias[h, j].item() == pytest.approx(want, rel=1e-6, abs=1e-6)
        # zero at distance 0, strictly falling with distance (the paper's CPD kernels)
        row = scheme.attention_bias(torch.tensor([50]), torch.arange(51))[:, 0]
        assert torch.all(row[:, -1] == 0) and torch.all(row[:, 1:] > row[:, :-1])
