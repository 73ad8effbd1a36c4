"""precision: auto picks bf16 only where the hardware runs it natively; explicit values pass."""

from __future__ import annotations

import pytest

from poslab import precision
from poslab.errors import ConfigError


@pytest.mark.parametrize("setting", ["32-true", "bf16-mixed", "16-mixed"])
def test_explicit_precision_passes_through(setting):
    assert precision.resolve_precision(setting, "cpu") == setting


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision='bf17'"):
        precision.resolve_precision("bf17", "cpu")


def test_auto_on_cpu_follows_the_measured_speedup(monkeypatch):
    # what this machine measures decides, and it is a real measurement (positive, finite)
    precision.cpu_bf16_speedup.cache_clear()
    speedup = precision.cpu_bf16_speedup()
    assert speedup >= 0.0
    expected = "bf16-mixed" if speedup >= precision.BF16_MARGIN else "32-true"
    assert precision.resolve_precision("auto", "cpu") == expected
    # and the rule itself, for a native and an emulating CPU
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: 2.8)
    assert precision.resolve_precision("auto", "cpu") == "bf16-mixed"
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: 0.33)
    assert precision.resolve_precision("auto", "cpu") == "32-true"


def test_cpu_flags_are_read_where_linux_has_them():
    flags = precision.cpu_has_bf16_instructions()
    assert flags in (True, False, None)
