"""precision: auto picks bf16 only where the hardware runs it natively; explicit values pass."""

from __future__ import annotations

import pytest

from poslab.errors import ConfigError
from poslab.model import precision


@pytest.mark.parametrize("setting", ["32-true", "bf16-mixed", "16-mixed"])
def test_explicit_precision_passes_through(setting):
    assert precision.resolve_precision(setting, "cpu") == setting


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision='bf17'"):
        precision.resolve_precision("bf17", "cpu")


def test_auto_on_cpu_follows_the_flags_and_never_changes_its_mind():
    """The CPU flags decide where Linux shows them: the same answer every time, whatever the
    machine's load (a timing swung 0.1×–4.3× under load and split one run in two precisions)."""
    flags = precision.cpu_has_bf16_instructions()
    choices = {precision.resolve_precision("auto", "cpu") for _ in range(20)}
    assert len(choices) == 1
    if flags is not None:
        assert choices == {"bf16-mixed" if flags else "32-true"}


def test_auto_times_matmuls_only_where_the_flags_cannot_be_read(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16_instructions", lambda: None)
    precision.cpu_bf16_speedup.cache_clear()
    speedup = precision.cpu_bf16_speedup()  # a real measurement on this machine
    assert speedup > 0.0
    expected = "bf16-mixed" if speedup >= precision.BF16_MARGIN else "32-true"
    assert precision.resolve_precision("auto", "cpu") == expected
    # the rule itself, for a native and an emulating CPU
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: 2.8)
    assert precision.resolve_precision("auto", "cpu") == "bf16-mixed"
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: 0.33)
    assert precision.resolve_precision("auto", "cpu") == "32-true"


@pytest.mark.parametrize("stored", ["32-true", "bf16-mixed"])
def test_a_resumed_run_keeps_the_precision_it_started_with(stored):
    # one of the two differs from what auto picks here, so this holds on any machine
    assert precision.resolve_precision("auto", "cpu", stored=stored) == stored
    # an explicit setting still wins (a user may change it on purpose)
    assert precision.resolve_precision("32-true", "cpu", stored="bf16-mixed") == "32-true"


def test_cpu_flags_are_read_where_linux_has_them():
    flags = precision.cpu_has_bf16_instructions()
    assert flags in (True, False, None)
