"""Which (scheme, kernel) pairs a run times: every kernel of conf/attention that serves a scheme
(`--attention all`, the default), or the kernels named, each checked before any timing."""

from __future__ import annotations

import torch

from poslab.bench.configs import (
    ALL_KERNELS,
    DEFAULT_KERNEL,
    Options,
    Pairing,
    Untimed,
    config_names,
    scheme_config,
)
from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked
from poslab.model.build import build_scheme, gpt_config_of


def kernel_choices() -> list[str]:
    """What --attention accepts: `all`, or the names of conf/attention."""
    return [ALL_KERNELS, *config_names("attention")]


def serving(options: Options, scheme: str, kernel: str) -> tuple[str, bool]:
    """(the kernel that computes for `scheme` under attention=`kernel`, whether it trains on
    the run's device); a ConfigError where it cannot serve the scheme, or the scheme cannot
    represent 16·L positions."""
    config = scheme_config(options.model, scheme, options.seq_len, options.max_len, kernel)
    pos = build_scheme(config["pos"], gpt_config_of(config, options.vocab))
    built = instantiate_checked(config["attention"])
    built.check(pos, 0.0)  # dropout 0: scheme_config sets it
    pos.check_length(options.max_len - 1)
    chosen = getattr(built, "chosen", None) or built  # auto picks when checked
    on_gpu = torch.device(options.device).type == "cuda"
    return chosen.name, chosen.trains_on_cpu or on_gpu


def plan(options: Options) -> tuple[list[Pairing], list[Untimed]]:
    """Every pair to time, in the order of --schemes (each scheme's main row first), and the
    pairs that serve but cannot be timed on this device. Named kernels must serve every scheme
    and train on the device (a ConfigError says which does not); with `all` a kernel that
    cannot serve a scheme is simply not its row."""
    pairs: list[Pairing] = []
    untimed: list[Untimed] = []
    everything = options.attention == [ALL_KERNELS]
    kernels = (
        [DEFAULT_KERNEL, *(k for k in config_names("attention") if k != DEFAULT_KERNEL)]
        if everything
        else list(dict.fromkeys(options.attention))
    )
    for scheme in options.schemes:
        served: set[str] = set()
        for i, kernel in enumerate(kernels):
            named = not everything or i == 0
            try:
                name, trains = serving(options, scheme, kernel)
            except ConfigError as err:
                if not named:  # it cannot serve the scheme (a length error failed auto first)
                    continue
                raise ConfigError(
                    f"--schemes {scheme} with --attention {kernel} (model {options.model}, "
                    f"L={options.seq_len}): {err}"
                ) from None
            if name in served:  # `auto` and the kernel it picks are one row
                continue
            served.add(name)
            if not trains:
                if named:
                    raise ConfigError(
                        f"--attention {kernel} trains on CUDA GPUs only (no backward pass on "
                        "CPUs); use --attention sdpa (or auto, or all), or --device cuda on a "
                        "GPU machine"
                    )
                untimed.append(Untimed(scheme, kernel, "trains on CUDA only (no CPU backward)"))
                continue
            pairs.append(Pairing(scheme, kernel, name, main=i == 0))
    return pairs, untimed
