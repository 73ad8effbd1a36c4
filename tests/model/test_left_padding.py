"""A batch of prompts of unequal length, padded on the left (model/gpt.py `left_padding`): each
sequence gets the logits and the greedy tokens it gets alone, with the key/value cache (every
scheme and kernel that keeps one: the padding keys hidden, positions from each sequence's first
token) and without it; and a padding the model cannot take is one clear error."""

from __future__ import annotations

import pytest
import torch
from conftest import SCHEMES
from models import VOCAB, kernel_names, tiny_gpt, tokens

from poslab.errors import ConfigError

LENGTHS = (5, 13, 9)  # the longest in the middle: padding before the first and the last
NEW = 6


def padded_batch(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(ids (3, 13) padded on the left with random tokens, the padding (3,), each prompt)."""
    prompts = [tokens(1, n, seed=seed + i) for i, n in enumerate(LENGTHS)]
    width = max(LENGTHS)
    filler = tokens(len(LENGTHS), width, seed=99)  # padding of any id: it must change nothing
    ids = torch.stack(
        [torch.cat([filler[i, : width - p.shape[1]], p[0]]) for i, p in enumerate(prompts)]
    )
    return ids, torch.tensor([width - n for n in LENGTHS]), prompts


def greedy(model: torch.nn.Module, ids: torch.Tensor, padding=None, cached=True) -> torch.Tensor:  # noqa: ANN001
    """`NEW` greedy tokens after `ids`, and the logits of every step (B, T + NEW − 1, V)."""
    cache = model.new_cache() if cached else None
    steps = []
    with torch.no_grad():
        for _ in range(NEW):
            fresh = ids if cache is None else ids[:, cache.length :]
            logits = model(fresh, cache=cache, left_padding=padding)
            steps.append(logits[:, -1:])
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids, torch.cat(steps, dim=1)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to rounding (as test_kv_cache: a batch's matrix products round otherwise)."""
    return bool((a - b).abs().max() <= 2e-5 * max(1.0, float(b.abs().max())))


def check_each_sequence_as_alone(model: torch.nn.Module, cached: bool) -> None:
    ids, padding, prompts = padded_batch()
    batch_ids, batch_steps = greedy(model, ids, padding, cached)
    for row, (prompt, lead) in enumerate(zip(prompts, padding.tolist(), strict=True)):
        alone_ids, alone_steps = greedy(model, prompt, cached=cached)
        assert batch_ids[row, lead:].tolist() == alone_ids[0].tolist(), f"sequence {row}"
        assert close(batch_steps[row], alone_steps[0]), f"sequence {row}"
    # the prompt's logits too, each sequence's real tokens
    with torch.no_grad():
        cache = model.new_cache() if cached else None
        logits = model(ids, cache=cache, left_padding=padding)
        for row, (prompt, lead) in enumerate(zip(prompts, padding.tolist(), strict=True)):
            assert close(logits[row, lead:], model(prompt)[0]), f"prompt {row}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_generates_a_left_padded_batch_as_each_sequence_alone(scheme):
    model = tiny_gpt(scheme)
    check_each_sequence_as_alone(model, cached=model.cache_problem() is None)


@pytest.mark.parametrize("kernel", [k for k in kernel_names() if k != "auto"])
def test_every_kernel_generates_a_left_padded_batch_as_each_sequence_alone(kernel):
    scheme = {"linear": "rope", "stick_breaking": "nope", "flex": "alibi"}.get(kernel, "cope")
    scheme = "alibi" if kernel == "sdpa" else scheme
    model = tiny_gpt(scheme, kernel, d_model=64)
    check_each_sequence_as_alone(model, cached=model.cache_problem() is None)


def test_a_window_gate_sinks_and_fox_decay_skip_the_padding():
    from poslab.model.gpt import GPT, GPTConfig

    for scheme, options in (("rope", {"window": 4}), ("fox", {})):
        base = tiny_gpt(scheme, kernel_options=options)
        config = GPTConfig(
            vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, gate="headwise", sinks=True
        )
        model = GPT(config, base.pos, base.attention).eval()
        check_each_sequence_as_alone(model, cached=True)
        check_each_sequence_as_alone(model, cached=False)


def test_without_padding_nothing_changes():
    """A padding of zeros is no padding: the batch's logits are the plain forward's, exactly."""
    model = tiny_gpt("rope")
    ids = tokens(2, 10)
    with torch.no_grad():
        plain = model(ids)
        assert torch.equal(model(ids, left_padding=torch.zeros(2, dtype=torch.long)), plain)
        cached = model(ids, cache=model.new_cache(), left_padding=[0, 0])
    assert close(cached, plain)


@pytest.mark.parametrize(
    "padding, message",
    [
        ([1], "2 whole numbers, one per sequence"),
        ([0.5, 1.0], "whole numbers"),
        ([0, 6], "at least one token of its 6"),
        ([-1, 0], "at least one token"),
    ],
)
def test_a_padding_the_model_cannot_take_is_one_clear_error(padding, message):
    model = tiny_gpt("rope")
    with pytest.raises(ConfigError, match=message):
        model(tokens(2, 6), left_padding=torch.tensor(padding))


def test_positions_and_padding_together_or_a_changed_padding_are_refused():
    model = tiny_gpt("rope")
    ids = tokens(2, 6)
    with pytest.raises(ConfigError, match="positions or left_padding, not both"):
        model(ids, positions=torch.arange(6), left_padding=torch.tensor([1, 0]))
    cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache=cache, left_padding=torch.tensor([1, 0]))
        model(ids[:, :1], cache=cache, left_padding=torch.tensor([1, 0]))  # the same: fine
        with pytest.raises(ConfigError, match="differs from the one this cache started with"):
            model(ids[:, :1], cache=cache, left_padding=torch.tensor([2, 0]))
