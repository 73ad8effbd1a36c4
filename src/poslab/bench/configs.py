"""The benchmark's options and the model config of each scheme, read from poslab's Hydra configs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from poslab.positions import scheme_names, scheme_yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
# the committed page is an explicit --out docs/benchmarks.md; by default nothing in the tree changes
DEFAULT_OUT = Path("outputs") / "benchmarks.md"  # under the working folder, as train.py's runs
EVAL_FACTORS = (1, 4, 16)  # evaluation lengths, as multiples of the training length L
REFERENCE = "nope"  # the "vs nope" column: no positional work at all is the floor to compare to
# training tok/s ≥ this × nope for every scheme (issue #26); a scheme below it is profiled
TARGET_VS_NOPE = 0.9
# evaluation tok/s ≥ this × training tok/s at 1× and 16× L; below it, nope's evaluation is profiled
TARGET_EVAL_OVER_TRAIN = 3.0
ALL_KERNELS = "all"  # --attention all: every kernel that serves a scheme
DEFAULT_KERNEL = "auto"  # what training uses unless attention= says otherwise


def available_schemes() -> list[str]:
    """The positional schemes of conf/pos (file stems), the reference `nope` first."""
    return sorted(scheme_names(), key=lambda s: s != REFERENCE)


def config_names(group: str) -> list[str]:
    """The options of a config group: the file stems of conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def scheme_config(
    model: str, scheme: str, seq_len: int, max_len: int, attention: str = "auto"
) -> dict[str, Any]:
    """The {"model", "pos"} config `build_model` takes: conf/model/<model>.yaml with dropout 0
    (it is not what is measured, and it differs between models), conf/pos/<scheme>.yaml (its
    defaults list applied) with `${data.seq_len}` = L, and a learned table of `max_len` rows so
    that it is defined at every length the benchmark trains or evaluates."""
    model_cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    pos_raw = scheme_yaml(scheme)
    if "max_positions" in pos_raw:
        pos_raw.max_positions = max_len
    # resolve interpolations (`${data.seq_len}`) against a minimal root
    root = OmegaConf.create({"data": {"seq_len": seq_len}, "pos": pos_raw})
    pos_cfg = OmegaConf.to_container(root.pos, resolve=True)
    model_cfg["dropout"] = 0.0
    attention_cfg = OmegaConf.to_container(OmegaConf.load(CONF / "attention" / f"{attention}.yaml"))
    return {"model": model_cfg, "pos": pos_cfg, "attention": attention_cfg}


@dataclass
class Options:
    model: str = "small"
    seq_len: int = 256
    batch_size: int = 16
    vocab: int = 8192
    # defaults sized for well under 10 minutes with --peer on 2 CPU cores (small, L=256)
    steps: int = 4  # timed training steps per job and round
    warmup: int = 2  # untimed steps before the first round (kernel selection, AdamW state)
    rounds: int = 3
    schemes: list[str] = field(default_factory=available_schemes)
    precision: str = "auto"
    # conf/attention/<name>.yaml: ["all"] = every kernel that serves each scheme (the scheme's
    # `auto` pick is its main row); else these kernels, the first one the main row
    attention: list[str] = field(default_factory=lambda: [ALL_KERNELS])
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    peer: bool = False
    compile: bool = False
    out: str = str(DEFAULT_OUT)
    eval_batches: int = 2  # evaluation batches per length and round
    max_matmul: int = 8192  # largest square matmul tried for the peak
    memory: bool = True  # measure peak memory (fresh processes)
    # the kernel table's rows also evaluated at 16·L (blockwise and stick-breaking take
    # 5-15 s per batch there on 2 CPU cores: ~20 min more for every scheme and kernel)
    kernel_eval: bool = False
    command: str = ""

    @property
    def max_len(self) -> int:
        return max(EVAL_FACTORS) * self.seq_len


@dataclass
class Pairing:
    """One (scheme, kernel) of a run. `kernel` is the conf/attention name the model is built
    with, `serving` the kernel that computes (what `auto` resolves to, else `kernel`); `main`:
    the scheme's row in the full tables (default kernel), else a row of the kernel table."""

    scheme: str
    kernel: str
    serving: str
    main: bool


@dataclass
class Untimed:
    """A kernel that serves a scheme but cannot be timed here, and why."""

    scheme: str
    kernel: str
    reason: str
