"""Tiny models for the tests: any scheme of conf/pos/ with any kernel of conf/attention/, with
weights large enough that positions visibly change the logits (the default std-0.02 init makes
the attention scores nearly zero, so nearly uniform attention whatever the positions say)."""

from __future__ import annotations

# the tiny models live in the package, where poslab-check-scheme uses them too
from poslab.positions.properties import (  # noqa: F401
    D_MODEL,
    N_HEAD,
    N_LAYER,
    SEQ_LEN,
    VOCAB,
    _scheme_configs,
    build_kernel,
    build_scheme,
    far_from_init,
    kernel_config,
    kernel_names,
    tiny_gpt,
    tokens,
)
