"""Scheme options out of range name their key (ConfigError before any work)."""

from __future__ import annotations

import re

import pytest

from poslab.errors import ConfigError
from poslab.positions import build_scheme


@pytest.mark.parametrize(
    ("scheme", "options", "expected"),
    [
        ("sandwich", {"dim": 7}, "pos.dim=7 must be even"),
        ("sandwich", {"dim": 1}, "pos.dim=1 must be an integer ≥ 2"),
        ("mrope", {"axes": 100}, "pos.axes=100 is more than the 8 rotary pairs"),
        ("mrope", {"sections": 5}, "pos.sections=5 must be a list of 3 integers"),
        ("rope2d", {"axes": 20, "axis_layout": "interleaved"}, "pos.axes=20"),
    ],
)
def test_scheme_options_out_of_range_name_their_key(scheme, options, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        build_scheme(scheme, d_model=64, n_head=4, **options)


def test_sandwich_needs_an_even_width_when_dim_follows_the_model():
    with pytest.raises(ConfigError, match=re.escape("pos.dim=null takes model.d_model=33")):
        build_scheme("sandwich", d_model=33, n_head=3)
    assert build_scheme("sandwich", d_model=64, n_head=4, dim=8).dim == 8
