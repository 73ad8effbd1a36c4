"""Generation's key/value cache (model/gpt.py KVCache): a model that claims one gives, a chunk
and then a token at a time, the logits of the whole sequence at once and the same greedy tokens,
for every scheme and every kernel that serves it; a model that cannot keep one says why."""

from __future__ import annotations

import pytest
import torch
from conftest import SCHEMES
from models import kernel_names, tiny_gpt, tokens

from poslab.errors import ConfigError

# schemes whose attention of a token depends on more than its position and the cached keys
NO_CACHE = {
    "grape": "layer_data",  # GRAPE-AP's positional features read each layer's input
    "path_attn": "layer_data",  # PaTH's Householder vectors too
    "ssmax": "forward's length",  # s·log n with n the token's index in the forward
    "xpos": "forward's length",  # exponents centred on the forward's mean position
}


def cached_logits(model: torch.nn.Module, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """The logits of `ids` fed in chunks of the given sizes, then one token at a time."""
    cache = model.new_cache()
    outputs, start = [], 0
    with torch.no_grad():
        for size in [*chunks, *[1] * (ids.shape[1] - sum(chunks))]:
            outputs.append(model(ids[:, start : start + size], cache=cache))
            start += size
    assert cache.length == ids.shape[1]
    return torch.cat(outputs, dim=1)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to rounding: one query's matrix products round otherwise than the whole
    sequence's, and the cache attends through the blockwise reference computation, the whole
    sequence through the model's kernel (CoPE's gates, summed along the keys, show it most:
    1e-5 of the largest logit; a wrong position or a stale key would show at 1e-1)."""
    return bool((a - b).abs().max() <= 2e-5 * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_caches_exactly_or_says_why_not(scheme):
    model = tiny_gpt(scheme)
    problem = model.cache_problem()
    if scheme in NO_CACHE:
        assert problem and NO_CACHE[scheme] in problem
        with pytest.raises(ConfigError, match="no key/value cache"):
            model.new_cache()
        return
    assert problem is None, problem
    ids = tokens(2, 40)
    with torch.no_grad():
        whole = model(ids)
    assert close(cached_logits(model, ids, [24, 7]), whole)


@pytest.mark.parametrize("kernel", [k for k in kernel_names() if k != "auto"])
def test_every_kernel_caches_exactly_or_says_why_not(kernel):
    scheme = {"linear": "rope", "stick_breaking": "nope", "flex": "alibi"}.get(kernel, "cope")
    scheme = "alibi" if kernel == "sdpa" else scheme
    model = tiny_gpt(scheme, kernel, d_model=64)
    problem = model.cache_problem()
    if kernel == "linear":
        assert problem and "running state" in problem
        return
    assert problem is None, problem
    ids = tokens(2, 33)
    with torch.no_grad():
        whole = model(ids)
    assert close(cached_logits(model, ids, [20]), whole)


def test_windows_gate_sinks_and_per_layer_schemes_cache_exactly():
    """A window per layer over a rope/nope schedule, with the output gate and sinks."""
    model = tiny_gpt("schedule", kernel_options={"window": [6, None]}, layers=["rope", "nope"])
    from poslab.model.gpt import GPT, GPTConfig

    gated = GPTConfig(vocab_size=41, n_layer=2, n_head=4, d_model=32, gate="headwise", sinks=True)
    model = GPT(gated, model.pos, model.attention).eval()
    ids = tokens(1, 30)
    with torch.no_grad():
        whole = model(ids)
    assert close(cached_logits(model, ids, [9, 2]), whole)


def test_greedy_decoding_with_the_cache_equals_it_without():
    from poslab.apps.generate import generate

    for scheme in ("rope", "alibi", "fox", "cope", "learned"):
        model = tiny_gpt(scheme)
        prompt = tokens(1, 8)
        args = (prompt, 20, 0.0, None, None, torch.Generator())
        plain = generate(model, *args)
        assert generate(model, *args, cache=model.new_cache()).tolist() == plain.tolist()


def test_a_length_dependent_extension_gets_no_cache():
    """Dynamic NTK rescales θ by the forward's length: keys cached at a shorter length would
    be rotated by another θ than the whole sequence's."""
    from models import _scheme_configs

    from poslab.positions.rope_scaling import scaling_options

    options = {"kind": "dynamic_ntk", "factor": "auto"}
    scaling = scaling_options(options, _scheme_configs()["rope"], 64, 16)
    model = tiny_gpt("rope", scaling=scaling)
    assert "forward's length" in (model.cache_problem() or "")


def test_a_learned_table_shorter_than_the_probe_still_gets_its_cache():
    """The locality probe takes 12 tokens; a table of 8 rows is probed at 8 (it raised before)."""
    model = tiny_gpt("learned", max_positions=8)
    assert model.cache_problem() is None
    ids = tokens(2, 8)
    with torch.no_grad():
        whole = model(ids)
    assert close(cached_logits(model, ids, [3]), whole)
