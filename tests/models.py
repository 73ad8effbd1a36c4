"""Tiny models for the tests: any scheme of conf/pos/ with any kernel of conf/attention/, with
weights large enough that positions visibly change the logits (the default std-0.02 init makes
the attention scores nearly zero, so nearly uniform attention whatever the positions say)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from conftest import CONF
from hydra.utils import instantiate
from omegaconf import OmegaConf

from poslab.instantiate import instantiate_checked
from poslab.model.gpt import GPT, GPTConfig
from poslab.positions import scheme_configs

VOCAB, D_MODEL, N_HEAD, N_LAYER = 41, 32, 4, 2
# the training length the schemes are built for: a learned table has this many rows
SEQ_LEN = 64


def kernel_names() -> list[str]:
    """Every kernel of conf/attention/, by file name."""
    return sorted(p.stem for p in (CONF / "attention").glob("*.yaml"))


@functools.cache
def _kernel_config(name: str) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(CONF / "attention" / f"{name}.yaml"))


def kernel_config(name: str) -> dict[str, Any]:
    """conf/attention/<name>.yaml."""
    return copy.deepcopy(_kernel_config(name))


def build_kernel(name: str, **options: Any) -> Any:
    return instantiate({**kernel_config(name), **options})


@functools.cache
def _scheme_configs() -> dict[str, dict[str, Any]]:
    return scheme_configs(SEQ_LEN)


def build_scheme(name: str, n_layer: int = N_LAYER, d_model: int = D_MODEL, **options: Any) -> Any:
    """poslab.positions.build_scheme for the test models' sizes, its configs composed once."""
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

    Weight matrices are drawn at std 0.2, and every positional parameter at N(0, 1): a
    zero-initialised table would say nothing, and a parameter's initial value may hide what a
    scheme does with positions (a learned threshold at the training length, below which a bias
    depends on m − n alone). `d_model` = 64 gives FlexAttention's smallest head size (16)."""
    torch.manual_seed(seed)
    pos = build_scheme(scheme, d_model=d_model, **scheme_options)
    config = GPTConfig(vocab_size=VOCAB, n_layer=N_LAYER, n_head=N_HEAD, d_model=d_model)
    return far_from_init(GPT(config, pos, build_kernel(kernel, **(kernel_options or {}))))


def far_from_init(model: GPT) -> GPT:
    """`model` with weight matrices at std 0.2 and positional parameters at N(0, 1) (see
    tiny_gpt), in eval mode."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("pos."):
                param.normal_(0, 1.0)
            elif param.dim() >= 2:
                param.normal_(0, 0.2)
    return model.eval()


def tokens(batch: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed))
