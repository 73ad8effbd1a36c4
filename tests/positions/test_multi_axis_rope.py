"""Multi-axis rotary (pos=mrope, pos=rope2d): M-RoPE on text is 1-D RoPE bit for bit, scores
depend on each axis only through that axis's difference, and bad sections are clear errors."""

from __future__ import annotations

import pytest
import torch

from poslab.errors import ConfigError
from poslab.positions.mrope import MRoPE
from poslab.positions.rope import Rotary, rope_theta
from poslab.positions.rope2d import Rotary2D

D_MODEL, N_HEAD = 64, 2  # head_dim 32: 16 rotary pairs


def qk(seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(2, N_HEAD, seq_len, D_MODEL // N_HEAD, generator=gen) for _ in range(2)
    )


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("sections", [None, [2, 3, 3]])
def test_mrope_with_equal_ids_on_every_axis_is_1d_rope_bit_for_bit(pairing, fraction, sections):
    if sections is not None and fraction == 1.0:
        sections = [4, 6, 6]
    mrope = MRoPE(D_MODEL, N_HEAD, sections=sections, pairing=pairing, fraction=fraction)
    rope = Rotary(D_MODEL, N_HEAD, pairing=pairing, fraction=fraction)
    q, k = qk(40)
    positions = torch.arange(40) * 7 + 3
    want = rope.rotate(q, k, positions)
    got = mrope.rotate(q, k, positions[:, None].expand(40, 3))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # the model's text positions are exactly that
    assert torch.equal(
        mrope.positions(2, 40, torch.device("cpu")), torch.arange(40)[:, None].expand(40, 3)
    )


def scores(scheme, positions, q, k):
    q_rot, k_rot = scheme.rotate(q, k, positions)
    return q_rot @ k_rot.transpose(-1, -2)


SCHEMES = {
    "mrope": lambda: MRoPE(D_MODEL, N_HEAD),
    "mrope_2axes": lambda: MRoPE(D_MODEL, N_HEAD, axes=2, sections=[10, 6]),
    "rope2d_split": lambda: Rotary2D(D_MODEL, N_HEAD, axis_layout="split"),
    "rope2d_interleaved": lambda: Rotary2D(D_MODEL, N_HEAD, axis_layout="interleaved"),
}


@pytest.mark.parametrize("name", SCHEMES)
def test_scores_depend_on_each_axis_only_through_its_difference(name):
    scheme = SCHEMES[name]()
    axes = scheme.position_axes
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 50, (24, axes), generator=gen)
    q, k = qk(24, seed=2)
    base = scores(scheme, positions, q, k)
    for axis in range(axes):  # one axis shifted for every token: nothing changes
        shifted = positions.clone()
        shifted[:, axis] += 1000
        torch.testing.assert_close(scores(scheme, shifted, q, k), base, atol=1e-3, rtol=1e-4)
        # one token moved on this axis alone: its row and column change, nothing else
        moved = positions.clone()
        moved[5, axis] += 3
        diff = (scores(scheme, moved, q, k) - base).abs()
        assert diff[..., 5, :].max() > 1e-3 and diff[..., :, 5].max() > 1e-3
        keep = torch.ones(24, dtype=torch.bool)
        keep[5] = False
        assert diff[..., keep, :][..., keep].max() < 1e-4


def test_mrope_sections_split_one_spectrum_and_rope2d_split_gives_each_axis_a_spectrum():
    mrope = MRoPE(D_MODEL, N_HEAD)
    assert mrope.sections == [4, 6, 6]  # Qwen2-VL's 16:24:24 of 64, for 16 pairs
    assert mrope.axis_of_pair.tolist() == [0] * 4 + [1] * 6 + [2] * 6
    torch.testing.assert_close(mrope.frequencies(), rope_theta(32, 10000.0))
    split = Rotary2D(D_MODEL, N_HEAD, axis_layout="split")
    assert split.axis_of_pair.tolist() == [0] * 8 + [1] * 8
    torch.testing.assert_close(split.frequencies(), rope_theta(16, 10000.0).repeat(2))
    inter = Rotary2D(D_MODEL, N_HEAD, axis_layout="interleaved")
    assert inter.axis_of_pair.tolist() == [0, 1] * 8
    assert MRoPE(D_MODEL, N_HEAD, axes=2).sections == [8, 8]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: MRoPE(D_MODEL, N_HEAD, sections=[4, 4, 4]), r"add up to 12 .* has 16"),
        (lambda: MRoPE(D_MODEL, N_HEAD, sections=[8, 8]), "must be 3 integers"),
        (lambda: MRoPE(D_MODEL, N_HEAD, axes=0), "pos.axes=0"),
        (lambda: Rotary2D(D_MODEL, N_HEAD, axis_layout="diagonal"), "pos.axis_layout"),
        (lambda: Rotary2D(D_MODEL, N_HEAD, axes=3), "same number of rotary pairs"),
        (lambda: MRoPE(D_MODEL, N_HEAD, randomize_max=512), "pos.randomize_max"),
        (lambda: MRoPE(D_MODEL, N_HEAD, scaling={"kind": "pi"}), "pos.scaling"),
    ],
)
def test_bad_multi_axis_options_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
