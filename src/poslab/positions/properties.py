"""The promises of the positional-scheme interface as checks any scheme can be put through:
poslab's own suite runs them on every shipped scheme (tests/positions/test_properties.py), and
`poslab-check-scheme pos=NAME` runs them on one, a researcher's own included (docs/own-scheme.md).

Each check takes tiny models (2 layers, weights far from their init so that positions visibly
change the logits) and raises AssertionError saying what broke:

- causality: changing the tokens after t changes no logit up to t (and does change later ones);
- shift invariance, for a scheme that declares `shift_invariant`: shifting every position by
  one offset changes nothing, while stretching the distances does; for any other scheme the
  offset shows;
- per-sequence positions (B, T) give each sequence what its own (T,) positions give;
- every softmax kernel that accepts the scheme gives the reference kernel's logits (blockwise:
  the scores in fp32, every hook applied);
- the evaluation's `position_offset` reaches the model, and changes nothing for a
  shift-invariant scheme.

Nothing here names a scheme or a kernel: which checks apply follows from what the scheme
declares (`shift_invariant`, `needs`) and what each kernel's `check` accepts.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked
from poslab.model.gpt import GPT, GPTConfig

VOCAB, D_MODEL, N_HEAD, N_LAYER = 41, 32, 4, 2
# the training length the schemes are built for: a learned table has this many rows
SEQ_LEN = 64
# positions at most this far from 0 stay within what every scheme was built for
ABSOLUTE_OFFSET = 40
KERNEL_CONF = Path(__file__).resolve().parents[1] / "conf" / "attention"


def kernel_names() -> list[str]:
    """Every kernel of conf/attention/, by file name."""
    return sorted(p.stem for p in KERNEL_CONF.glob("*.yaml"))


@functools.cache
def _kernel_config(name: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(KERNEL_CONF / f"{name}.yaml"))


def kernel_config(name: str) -> dict[str, Any]:
    """conf/attention/<name>.yaml, as a fresh dict."""
    return copy.deepcopy(_kernel_config(name))


def build_kernel(name: str, **options: Any) -> Any:
    from hydra.utils import instantiate

    return instantiate({**kernel_config(name), **options})


def _scheme_configs() -> dict[str, dict[str, Any]]:
    """Every scheme's config at SEQ_LEN, composed once per setting of POSLAB_USER."""
    import os

    from poslab.user import ENV

    return _configs_for(os.environ.get(ENV, ""))


@functools.cache
def _configs_for(user: str) -> dict[str, dict[str, Any]]:
    from poslab.positions import scheme_configs

    return scheme_configs(SEQ_LEN)


def build_scheme(name: str, n_layer: int = N_LAYER, d_model: int = D_MODEL, **options: Any) -> Any:
    """A scheme by name at the tiny models' sizes, with `options` over its YAML."""
    config = {**copy.deepcopy(_scheme_configs()[name]), **options}
    return instantiate_checked(config, d_model=d_model, n_head=N_HEAD, n_layer=n_layer)


def tiny_gpt(
    scheme: str,
    kernel: str = "auto",
    seed: int = 0,
    kernel_options: dict[str, Any] | None = None,
    d_model: int = D_MODEL,
    **scheme_options: Any,
) -> GPT:
    """A 2-layer GPT of `scheme` (with `scheme_options` over its YAML) and `kernel`, in eval mode.

    Weight matrices are drawn at std 0.2, and every positional parameter at N(0, 1): the default
    std-0.02 init makes the scores nearly zero (attention nearly uniform whatever the positions
    say), a zero-initialised table would say nothing, and a parameter's initial value may hide
    what a scheme does with positions. `d_model` = 64 gives FlexAttention's smallest head size."""
    torch.manual_seed(seed)
    pos = build_scheme(scheme, d_model=d_model, **scheme_options)
    config = GPTConfig(vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, d_model=d_model)
    return far_from_init(GPT(config, pos, build_kernel(kernel, **(kernel_options or {}))))


def far_from_init(model: GPT) -> GPT:
    """`model` with weight matrices at std 0.2 and positional parameters at N(0, 1), in eval
    mode (see tiny_gpt)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("pos."):
                param.normal_(0, 1.0)
            elif param.dim() >= 2:
                param.normal_(0, 0.2)
    return model.eval()


def tokens(batch: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def accepting_kernels(pos: Any, kernels: list[tuple[str, dict[str, Any]]]) -> list[tuple]:
    """(name, options) of the kernels whose own `check` accepts the scheme `pos`, as when a
    model is built."""
    found = []
    for name, options in kernels:
        try:
            build_kernel(name, **options).check(pos, 0.0)
        except ConfigError:
            continue
        found.append((name, options))
    return found


# -- the checks ---------------------------------------------------------------------------------


@torch.no_grad()
def check_causality(model: GPT) -> None:
    """Changing the tokens after t changes no logit up to t, and does change later ones."""
    seq_len = 16
    idx = tokens(2, seq_len)
    gen = torch.Generator().manual_seed(2)
    logits = model(idx)
    for t in (0, 4, 9, seq_len - 2):
        changed = idx.clone()
        shift = torch.randint(1, model.config.vocab_size, (2, seq_len - t - 1), generator=gen)
        changed[:, t + 1 :] = (idx[:, t + 1 :] + shift) % model.config.vocab_size
        new = model(changed)
        torch.testing.assert_close(
            new[:, : t + 1], logits[:, : t + 1], atol=1e-5, rtol=0,
            msg=lambda m, t=t: f"tokens after {t} changed the logits up to {t}: {m}",
        )  # fmt: skip
        assert (new[:, t + 1 :] - logits[:, t + 1 :]).abs().max() > 1e-4, (
            f"tokens after {t} changed no later logit: the model ignores its context"
        )


@torch.no_grad()
def check_shift_invariance(model: GPT) -> None:
    """Shifting every position by the same offset changes nothing; stretching the distances
    does (else the check would pass merely because positions are ignored)."""
    seq_len = 12
    idx = tokens(2, seq_len)
    base = model(idx)
    for offset in (1, 23, 300, 777):
        torch.testing.assert_close(
            model(idx, torch.arange(seq_len) + offset), base, atol=2e-4, rtol=0,
            msg=lambda m, o=offset: f"shifting every position by {o} changed the logits "
            f"(the scheme declares shift_invariant): {m}",
        )  # fmt: skip
    if model.pos.reads_positions:
        stretched = model(idx, torch.arange(seq_len) * 2)
        assert (stretched - base).abs().max() > 1e-3, (
            "doubling every distance changed no logit: the scheme ignores its positions"
        )


@torch.no_grad()
def check_offset_shows(model: GPT) -> None:
    """A scheme that is not shift-invariant sees an offset of every position."""
    idx = tokens(2, 16)
    shifted = model(idx, torch.arange(16) + ABSOLUTE_OFFSET)
    assert (shifted - model(idx)).abs().max() > 1e-3, (
        f"shifting every position by {ABSOLUTE_OFFSET} changed no logit: if attention depends "
        "on m − n only, declare shift_invariant = True"
    )


@torch.no_grad()
def check_per_sequence_positions(model: GPT) -> None:
    """(B, T) positions give each sequence what its own (T,) positions give."""
    idx = tokens(2, 12, seed=4)
    rows = torch.stack([torch.arange(12) * 2 + 3, torch.arange(12)])
    both = model(idx, rows)
    for b in range(2):
        torch.testing.assert_close(
            both[b], model(idx[b : b + 1], rows[b])[0], atol=1e-5, rtol=0,
            msg=lambda m, b=b: f"sequence {b} with (B, T) positions differs from alone: {m}",
        )  # fmt: skip


@torch.no_grad()
def check_reference_attention(model: GPT, reference: GPT, other: GPT) -> None:
    """`model` (a softmax kernel) gives the logits of `reference` (the same weights on the
    blockwise kernel) for shared, shifted and per-sequence positions; `other` (other weights)
    shows the comparison is not vacuous."""
    idx = tokens(2, 16)
    for positions in (None, torch.stack([torch.arange(16) * 3 + 5, torch.arange(16) + 7])):
        torch.testing.assert_close(
            model(idx, positions), reference(idx, positions), atol=1e-4, rtol=0,
            msg=lambda m: f"this kernel's logits differ from the reference kernel's: {m}",
        )  # fmt: skip
    assert not torch.allclose(other(idx), reference(idx), atol=1e-3)


def _toy_split(n: int = 203, seed: int = 1) -> Any:
    from poslab.data.tokens import TokenizedSplit

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, n).astype(np.int32)
    return TokenizedSplit(
        ids, rng.integers(0, 3, n).astype(np.int32), rng.integers(0, 9, n).astype(np.int32)
    )


def check_eval_offset(model: GPT, shift_invariant: bool) -> None:
    """eval.position_offset reaches the model: a shift-invariant scheme's perplexity is
    unchanged by it, any other scheme's is not."""
    from poslab.evaluation.perplexity import score

    data = _toy_split()
    base = score(model, data, 16, progress=False).nll
    offset = 1000 if shift_invariant else ABSOLUTE_OFFSET
    shifted = score(model, data, 16, position_offset=offset, progress=False).nll
    same = abs(shifted - base) <= 1e-5 * abs(base)
    if shift_invariant:
        assert same, f"eval.position_offset={offset} changed the NLL ({base:.6f} -> {shifted:.6f})"
    else:
        assert not same, f"eval.position_offset={offset} did not change the NLL ({base:.6f})"


# -- one scheme, every check: poslab-check-scheme ------------------------------------------------


def scheme_checks(
    scheme: str, options: dict[str, Any] | None = None
) -> list[tuple[str, str, Callable[[], None]]]:
    """(check, kernel, run) for every check that applies to `scheme` with `options` over its
    YAML: the model-level ones on every kernel that accepts it and trains on this machine, the
    reference comparison on every other softmax kernel."""
    from poslab.model.attention import flex_available
    from poslab.positions import scheme_class

    options = dict(options or {})
    invariant = scheme_class(scheme).shift_invariant
    pos = build_scheme(scheme, **options)
    names = [n for n in kernel_names() if n != "flex" or flex_available()]
    kernels = accepting_kernels(pos, [(n, {}) for n in names])
    if not kernels:
        raise ConfigError(f"pos={scheme}: no attention kernel accepts it (each kernel's check)")

    def model(kernel: str, seed: int = 0) -> GPT:
        return tiny_gpt(scheme, kernel, seed=seed, **options)

    checks: list[tuple[str, str, Callable[[], None]]] = []
    for kernel, _ in kernels:
        attention = build_kernel(kernel)
        if attention.trains_on_cpu:
            checks.append(("causality", kernel, lambda k=kernel: check_causality(model(k))))
            if invariant:
                run = lambda k=kernel: check_shift_invariance(model(k))
                checks.append(("depends on m − n only", kernel, run))
            else:
                checks.append(
                    ("sees an offset", kernel, lambda k=kernel: check_offset_shows(model(k)))
                )
            run = lambda k=kernel: check_per_sequence_positions(model(k))
            checks.append(("per-sequence positions", kernel, run))
        reference = any(name == "blockwise" for name, _ in kernels)
        if attention.softmax and kernel != "blockwise" and reference:
            run = lambda k=kernel: _against_reference(model(k), model("blockwise", 123), model)
            checks.append(("equals the reference kernel", kernel, run))
    run = lambda: check_eval_offset(model("auto"), invariant)
    checks.append(("eval.position_offset", "auto", run))
    return checks


def _against_reference(tested: GPT, reference: GPT, model: Callable[..., GPT]) -> None:
    """`tested` against the reference kernel given its weights, and a model of other weights."""
    reference.load_state_dict(tested.state_dict())
    check_reference_attention(tested, reference, model("blockwise", 7))
