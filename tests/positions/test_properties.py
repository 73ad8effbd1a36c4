"""The promises of the positional-scheme interface, for every scheme of conf/pos/ with every
kernel of conf/attention/ that serves it (the kernel's own `check` decides, as when a model is
built): causality, m − n only for the schemes that declare `shift_invariant` (the offset shows
for the others), per-sequence positions, the kernels computing one attention, position work
done once per forward, and the evaluation's position offset.

Nothing here names a scheme or a kernel to decide what applies: a new scheme (one module, one
YAML file) is covered without a line changed. Options that change how a scheme computes
(`SCHEME_VARIANTS`) or how a kernel does (`KERNEL_VARIANTS`) are tried on every scheme or kernel
that has them (a kernel's variants on the schemes they can change: `_acts_before_the_kernel`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from models import build_kernel, build_scheme, kernel_config, kernel_names, tiny_gpt, tokens

from poslab.data.tokens import TokenizedSplit
from poslab.errors import ConfigError
from poslab.evaluation.perplexity import score
from poslab.model.attention import flex_available
from poslab.positions import scheme_class, scheme_configs, scheme_names

# options tried on every scheme whose YAML has them (besides its defaults)
SCHEME_VARIANTS = [{"pairing": "half"}, {"per_layer": True}, {"combine": "concat"}]
# options tried on every kernel whose YAML has them: query blocks (and a bias built per block)
# much shorter than the sequence; the other similarity of linear attention
KERNEL_VARIANTS = [{"block_size": 5, "full_bias_mib": 0, "chunk_size": 5}, {"similarity": "cosine"}]


def _label(name: str, options: dict[str, Any]) -> str:
    return name + "".join(f"({k}={v})" for k, v in options.items())


def _variants(config: dict[str, Any], variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """{} (the defaults), then each variant's options the config has and sets otherwise."""
    found = [{}]
    for variant in variants:
        options = {k: v for k, v in variant.items() if k in config and config[k] != v}
        if options and options not in found:
            found.append(options)
    return found


def _schemes() -> list[tuple[str, dict[str, Any]]]:
    configs = scheme_configs()
    return [(n, o) for n in scheme_names() for o in _variants(configs[n], SCHEME_VARIANTS)]


def _kernels() -> list[tuple[str, dict[str, Any]]]:
    names = [n for n in kernel_names() if n != "flex" or flex_available()]
    return [(n, o) for n in names for o in _variants(kernel_config(n), KERNEL_VARIANTS)]


def _acts_before_the_kernel(pos: Any, attention: Any) -> bool:
    """A scheme that needs nothing from a kernel that does not rotate inside acts on the
    embeddings or on q and k before the kernel sees them: the kernel then computes exactly what
    it computes for nope, so its variants (query blocks, a bias per block) are tried on nope
    (which reads no positions) and on the schemes that reach into the kernel, not on every
    rotary variant again."""
    return pos.needs == "nothing" and not attention.rotates_inside and pos.reads_positions


def _pairs() -> list[Any]:
    """(scheme, its options, kernel, its options) for every kernel whose `check` accepts the
    scheme."""
    pairs = []
    for scheme, scheme_options in SCHEMES:
        pos = build_scheme(scheme, **scheme_options)
        for kernel, kernel_options in _kernels():
            attention = build_kernel(kernel, **kernel_options)
            try:
                attention.check(pos, 0.0)
            except ConfigError:
                continue
            if kernel_options and not attention.trains_on_cpu:
                continue  # a forward-only CPU path (flex): its default options only
            if kernel_options and _acts_before_the_kernel(pos, attention):
                continue  # the kernel's own variants are tried on schemes that reach into it
            label = f"{_label(scheme, scheme_options)}-{_label(kernel, kernel_options)}"
            pairs.append(pytest.param(scheme, scheme_options, kernel, kernel_options, id=label))
    return pairs


SCHEMES = _schemes()
ALL_PAIRS = _pairs()
# softmax kernels are compared with the reference kernel
SOFTMAX_PAIRS = [p for p in ALL_PAIRS if build_kernel(p.values[2]).softmax]
# the properties, on every kernel that trains on this machine's CPU (with its options'
# variants); a forward-only CPU path (flex) is held to the reference kernel's logits instead,
# which carries every property over
PAIRS = [p for p in ALL_PAIRS if build_kernel(p.values[2]).trains_on_cpu]
RELATIVE_PAIRS = [p for p in PAIRS if scheme_class(p.values[0]).shift_invariant]
ABSOLUTE_PAIRS = [p for p in PAIRS if not scheme_class(p.values[0]).shift_invariant]
SCHEME_PARAMS = [pytest.param(s, o, id=_label(s, o)) for s, o in SCHEMES]
# positions at most this far from 0 stay within what every scheme was built for (a learned
# table has SEQ_LEN rows)
ABSOLUTE_OFFSET = 40


def test_the_pairs_follow_the_kernels_checks():
    """The lists above are not empty by mistake: every scheme has a kernel, and some
    kernels refuse some schemes."""
    assert {p.values[0] for p in PAIRS} == set(scheme_names())
    assert len(ALL_PAIRS) < len(SCHEMES) * len(_kernels())
    assert SOFTMAX_PAIRS != ALL_PAIRS
    assert RELATIVE_PAIRS and ABSOLUTE_PAIRS


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), PAIRS)
def test_causality(scheme, scheme_options, kernel, kernel_options):
    """Changing the tokens after t changes no logit up to t, and does change later ones."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    seq_len = 16
    idx = tokens(2, seq_len)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        logits = model(idx)
        for t in (0, 4, 9, seq_len - 2):
            changed = idx.clone()
            shift = torch.randint(1, model.config.vocab_size, (2, seq_len - t - 1), generator=gen)
            changed[:, t + 1 :] = (idx[:, t + 1 :] + shift) % model.config.vocab_size
            new = model(changed)
            torch.testing.assert_close(new[:, : t + 1], logits[:, : t + 1], atol=1e-5, rtol=0)
            assert (new[:, t + 1 :] - logits[:, t + 1 :]).abs().max() > 1e-4


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), RELATIVE_PAIRS)
def test_relative_schemes_depend_on_m_minus_n_only(scheme, scheme_options, kernel, kernel_options):
    """Shifting every position by the same offset changes nothing."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    seq_len = 12
    idx = tokens(2, seq_len)
    with torch.no_grad():
        base = model(idx)
        for offset in (1, 23, 300, 777):
            shifted = model(idx, torch.arange(seq_len) + offset)
            torch.testing.assert_close(shifted, base, atol=2e-4, rtol=0)
        if model.pos.reads_positions:
            # control: changing relative distances does change the logits, so the check above
            # is not passing merely because positions are ignored
            stretched = model(idx, torch.arange(seq_len) * 2)
            assert (stretched - base).abs().max() > 1e-3


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), ABSOLUTE_PAIRS)
def test_absolute_schemes_see_the_offset(scheme, scheme_options, kernel, kernel_options):
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    seq_len = 16
    idx = tokens(2, seq_len)
    with torch.no_grad():
        base = model(idx)
        shifted = model(idx, torch.arange(seq_len) + ABSOLUTE_OFFSET)
    assert (shifted - base).abs().max() > 1e-3


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), PAIRS)
def test_per_sequence_positions_equal_shared_ones(scheme, scheme_options, kernel, kernel_options):
    """(B, T) positions give each sequence what its own (T,) positions give."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    idx = tokens(2, 12, seed=4)
    rows = torch.stack([torch.arange(12) * 2 + 3, torch.arange(12)])
    with torch.no_grad():
        both = model(idx, rows)
        for b in range(2):
            alone = model(idx[b : b + 1], rows[b])[0]
            torch.testing.assert_close(both[b], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), SOFTMAX_PAIRS)
def test_every_softmax_kernel_computes_the_reference_attention(
    scheme, scheme_options, kernel, kernel_options
):
    """Every softmax kernel (sdpa with its bias built whole or per block of queries, flex's
    score_mod, ...) gives the logits of the reference kernel (attention=blockwise: the scores in
    fp32, every hook applied), for shared, shifted and per-sequence positions."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    reference = tiny_gpt(scheme, "blockwise", seed=123, **scheme_options)
    reference.load_state_dict(model.state_dict())
    idx = tokens(2, 16)
    with torch.no_grad():
        for positions in (None, torch.stack([torch.arange(16) * 3 + 5, torch.arange(16) + 7])):
            torch.testing.assert_close(
                model(idx, positions), reference(idx, positions), atol=1e-4, rtol=0
            )
        # a different model really gives different logits (the comparison is not vacuous)
        other = tiny_gpt(scheme, "blockwise", seed=7, **scheme_options)
        assert not torch.allclose(other(idx), reference(idx), atol=1e-3)


@pytest.mark.parametrize(("scheme", "scheme_options"), SCHEME_PARAMS)
def test_position_work_is_done_once_per_forward(scheme, scheme_options, monkeypatch):
    """The positions are prepared (rotary angles, ...) once per forward, not per layer, and with
    the default kernel a bias is built once (once per layer for per-layer parameters)."""
    model = tiny_gpt(scheme, **scheme_options)
    calls = {"prepare": 0, "attention_bias": 0}
    for hook in calls:
        original = getattr(model.pos, hook)

        def spy(*args, _original=original, _hook=hook, **kwargs):
            calls[_hook] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(model.pos, hook, spy)
    with torch.no_grad():
        model(tokens(2, 12))
    assert model.config.n_layer == 2
    assert calls["prepare"] == 1
    per_forward = model.config.n_layer if model.pos.per_layer else 1
    assert calls["attention_bias"] == (per_forward if model.pos.needs == "bias" else 0)


def _toy_split(n: int = 203, seed: int = 1) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 41, n).astype(np.int32)
    return TokenizedSplit(
        ids, rng.integers(0, 3, n).astype(np.int32), rng.integers(0, 9, n).astype(np.int32)
    )


@pytest.mark.parametrize(("scheme", "scheme_options"), SCHEME_PARAMS)
def test_the_evaluations_position_offset_shows_only_for_absolute_schemes(scheme, scheme_options):
    """eval.position_offset reaches the model: the perplexity of a shift-invariant scheme is
    unchanged by it, that of any other scheme is not."""
    model, data = tiny_gpt(scheme, **scheme_options), _toy_split()
    base = score(model, data, 16, progress=False)
    if scheme_class(scheme).shift_invariant:
        shifted = score(model, data, 16, position_offset=1000, progress=False)
        assert shifted.nll == pytest.approx(base.nll, rel=1e-5)
    else:
        shifted = score(model, data, 16, position_offset=ABSOLUTE_OFFSET, progress=False)
        assert shifted.nll != pytest.approx(base.nll, rel=1e-5)
