"""poslab/attention.py: the kernels' options (attention.full_bias_mib)."""

from __future__ import annotations

import re

import pytest

from poslab.attention import SDPA, Auto
from poslab.errors import ConfigError


@pytest.mark.parametrize("kernel", [SDPA, Auto])
@pytest.mark.parametrize("value", [-1, "abc", float("nan"), True])
def test_full_bias_mib_must_be_a_size(kernel, value):
    with pytest.raises(ConfigError, match=re.escape("attention.full_bias_mib=")):
        kernel(full_bias_mib=value)


def test_full_bias_mib_takes_zero_and_fractions_of_a_mib():
    assert SDPA(full_bias_mib=0).full_bias_bytes == 0  # always per block of queries
    assert SDPA(full_bias_mib=0.5).full_bias_bytes == 2**19
