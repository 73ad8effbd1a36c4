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

import pytest
import torch
from models import build_kernel, build_scheme, kernel_config, kernel_names, tiny_gpt, tokens

from poslab.model.attention import flex_available
from poslab.positions import scheme_class, scheme_configs, scheme_names
from poslab.positions.properties import (
    accepting_kernels,
    check_causality,
    check_eval_offset,
    check_offset_shows,
    check_per_sequence_positions,
    check_reference_attention,
    check_shift_invariance,
)

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
        for kernel, kernel_options in accepting_kernels(pos, _kernels()):
            attention = build_kernel(kernel, **kernel_options)
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
    check_causality(tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options))


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), RELATIVE_PAIRS)
def test_relative_schemes_depend_on_m_minus_n_only(scheme, scheme_options, kernel, kernel_options):
    """Shifting every position by the same offset changes nothing; stretching does."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    check_shift_invariance(model)


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), ABSOLUTE_PAIRS)
def test_absolute_schemes_see_the_offset(scheme, scheme_options, kernel, kernel_options):
    check_offset_shows(tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options))


@pytest.mark.parametrize(("scheme", "scheme_options", "kernel", "kernel_options"), PAIRS)
def test_per_sequence_positions_equal_shared_ones(scheme, scheme_options, kernel, kernel_options):
    """(B, T) positions give each sequence what its own (T,) positions give."""
    model = tiny_gpt(scheme, kernel, kernel_options=kernel_options, **scheme_options)
    check_per_sequence_positions(model)


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
    other = tiny_gpt(scheme, "blockwise", seed=7, **scheme_options)
    check_reference_attention(model, reference, other)


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


@pytest.mark.parametrize(("scheme", "scheme_options"), SCHEME_PARAMS)
def test_the_evaluations_position_offset_shows_only_for_absolute_schemes(scheme, scheme_options):
    """eval.position_offset reaches the model: the perplexity of a shift-invariant scheme is
    unchanged by it, that of any other scheme is not."""
    check_eval_offset(tiny_gpt(scheme, **scheme_options), scheme_class(scheme).shift_invariant)
