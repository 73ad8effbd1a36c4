"""Speed and memory of every positional scheme: training, evaluation, and against x-transformers.

    python scripts/benchmark.py                      # small model, L=256, every scheme in conf/pos
    python scripts/benchmark.py --peer --compile     # + x-transformers (pip install -e ".[bench]")
    python scripts/benchmark.py --model tiny --steps 1 --rounds 1 --schemes nope rope \\
        --out /tmp/bench.md                          # a smoke run

For every scheme (the stems of conf/pos/*.yaml) it measures

* training tokens/s at the training length L: exactly the step training takes (`model.loss`, the
  fused chunked cross-entropy; backward; gradient clipping at 1.0; AdamW; zero_grad), under the
  autocast dtype of `--precision` (default `auto`, resolved by poslab.precision), on random
  token ids; the model FLOPs utilisation (MFU) of that step against the peak matmul throughput
  measured on the device, at the same dtype, in the same run; peak memory of the step;
* training tokens/s at 16·L with the same tokens per step, so that evaluation and training
  compare like with like at 16×;
* evaluation tokens/s of the real evaluation (`poslab.evaluation.perplexity.score`,
  non-overlapping windows) at 1×, 4× and 16× L, and peak memory at 16× L;
* with `--peer`, the same size and scheme built with x-transformers, trained with the same
  batch, loss (cross-entropy over its logits), optimizer and precision;
* with `--compile`, the training step compiled as `trainer.compile=true` compiles it.

Measurements alternate: every round times k steps of every job in turn (ours, then the peer,
then the next scheme), and each job reports its median over the rounds, so that drift of a
shared machine hits all of them alike. Peak memory is measured in fresh processes (forked from a
server that has only imported torch and poslab), one per measurement, so that no allocation of
another measurement can hide in it.

The report (machine, command, tables, and each target of the project checked as met/not met)
is printed and written to `--out` (default docs/benchmarks.md; `--out ''` writes nothing).

A bad option (an unknown model, scheme or kernel, a count below 1, a device this machine lacks, a
scheme the kernel cannot serve, an --out that cannot be written) ends with one `error: ...` line
on stderr and exit code 2 before any measurement.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import json
import logging
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor, nn

from poslab.build import build_model, build_scheme, gpt_config_of
from poslab.errors import ConfigError, exit_on_config_error
from poslab.evaluation.compare import OneLineParser, check_writable
from poslab.instantiate import instantiate_checked
from poslab.model import GPT
from poslab.precision import AUTOCAST_DTYPE, PRECISIONS, resolve_precision

# poslab.data and poslab.evaluation.perplexity are imported where they are used: they import
# Lightning (seconds), which a bad argument should not wait for
if TYPE_CHECKING:
    from poslab.data import TokenizedSplit

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "src" / "poslab" / "conf"
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
EVAL_FACTORS = (1, 4, 16)  # evaluation lengths, as multiples of the training length L
REFERENCE = "nope"  # the "vs nope" column: no positional work at all is the floor to compare to
# targets of the project's issue (docs/benchmarks.md checks each)
TARGET_VS_PEER = 1.2
TARGET_VS_NOPE = 0.95
TARGET_MFU = 0.60
TARGET_EVAL_OVER_TRAIN = 3.0
TARGET_MEM_BYTES = 2e9
TARGET_MEM_SCHEMES = ("alibi", "t5")
LR = 1e-4  # tiny: the benchmark only needs steps that stay finite on random tokens
WEIGHT_DECAY = 0.1
# a matmul peak is the best of these sizes that each take at most this long (bigger is faster,
# until the time budget; 2 CPU cores reach their peak around 1024-2048)
MATMUL_SIZES = (256, 512, 1024, 2048, 4096, 8192)
MATMUL_BUDGET_S = 0.5

# --------------------------------------------------------------------------------------------
# configuration


def available_schemes() -> list[str]:
    """The positional schemes of conf/pos (file stems), the reference `nope` first."""
    stems = sorted(p.stem for p in (CONF / "pos").glob("*.yaml"))
    return sorted(stems, key=lambda s: s != REFERENCE)


def config_names(group: str) -> list[str]:
    """The options of a config group: the file stems of conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def scheme_config(
    model: str, scheme: str, seq_len: int, max_len: int, attention: str = "auto"
) -> dict[str, Any]:
    """The {"model", "pos"} config `build_model` takes: conf/model/<model>.yaml with dropout 0
    (it is not what is measured, and it differs between models), conf/pos/<scheme>.yaml with
    `${data.seq_len}` = L, and a learned table of `max_len` rows so that it is defined at every
    length the benchmark trains or evaluates."""
    model_cfg = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{model}.yaml"))
    pos_raw = OmegaConf.load(CONF / "pos" / f"{scheme}.yaml")
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
    attention: str = "auto"  # conf/attention/<name>.yaml for every scheme
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    peer: bool = False
    compile: bool = False
    out: str = str(DEFAULT_OUT)
    eval_batches: int = 2  # evaluation batches per length and round
    max_matmul: int = 8192  # largest square matmul tried for the peak
    memory: bool = True  # measure peak memory (fresh processes)
    command: str = ""

    @property
    def max_len(self) -> int:
        return max(EVAL_FACTORS) * self.seq_len


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number ≥ `minimum` (else argparse's one-line error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum} (got {value})")
        return value

    return parse


def device_arg(text: str) -> str:
    """An argparse `type`: cpu, or a CUDA device this machine has (the timings and memory
    measurements know these two)."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu or cuda") from None
    if device.type == "cpu":
        return text
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(f"{text!r}: the benchmark runs on cpu or cuda (cuda:N)")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text!r}: this machine has no CUDA GPU that torch can use; use --device cpu"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(
            f"{text!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
        )
    return text


def parse_args(argv: list[str] | None = None) -> Options:
    """The options of the command line; a bad value is one `error: ...` line (a ConfigError)."""
    defaults = Options()
    p = OneLineParser(
        prog="scripts/benchmark.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    positive = at_least(1)
    p.add_argument("--model", default=defaults.model, choices=config_names("model"),
                   help="conf/model/<name>.yaml")  # fmt: skip
    p.add_argument("--seq-len", type=positive, default=defaults.seq_len, help="training length L")
    p.add_argument("--batch-size", type=positive, default=defaults.batch_size)
    p.add_argument("--vocab", type=positive, default=defaults.vocab)
    p.add_argument("--steps", type=positive, default=defaults.steps, help="timed steps per round")
    p.add_argument("--warmup", type=at_least(0), default=defaults.warmup,
                   help="untimed steps first")  # fmt: skip
    p.add_argument("--rounds", type=positive, default=defaults.rounds)
    p.add_argument("--schemes", nargs="+", default=defaults.schemes, choices=available_schemes(),
                   metavar="SCHEME", help="default: every scheme of conf/pos")  # fmt: skip
    p.add_argument("--precision", default=defaults.precision, choices=PRECISIONS)
    p.add_argument("--attention", default=defaults.attention, choices=config_names("attention"),
                   help="conf/attention/<name>.yaml (all schemes)")  # fmt: skip
    p.add_argument("--device", type=device_arg, default=defaults.device, help="cpu or cuda[:N]")
    p.add_argument("--peer", action="store_true", help="also time x-transformers")
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd steps")
    p.add_argument("--out", default=defaults.out, help="Markdown report ('' = none)")
    p.add_argument("--eval-batches", type=positive, default=defaults.eval_batches)
    args = p.parse_args(argv)
    return Options(
        model=args.model,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        vocab=args.vocab,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        schemes=list(dict.fromkeys(args.schemes)),
        precision=args.precision,
        attention=args.attention,
        device=args.device,
        peer=args.peer,
        compile=args.compile,
        out=args.out,
        eval_batches=args.eval_batches,
        command=command_line(argv),
    )


def check_options(options: Options) -> None:
    """What would fail part-way through the benchmark, found before any work: a scheme that the
    attention kernel cannot serve or that cannot represent 16·L positions, a kernel that cannot
    train on the device, a report path that cannot be written."""
    on_gpu = torch.device(options.device).type == "cuda"
    for scheme in options.schemes:
        config = scheme_config(
            options.model, scheme, options.seq_len, options.max_len, options.attention
        )
        try:
            pos = build_scheme(config["pos"], gpt_config_of(config, options.vocab))
            kernel = instantiate_checked(config["attention"])
            kernel.check(pos, 0.0)  # dropout 0: scheme_config sets it
            pos.check_length(options.max_len - 1)
        except ConfigError as err:
            raise ConfigError(
                f"--schemes {scheme} with --attention {options.attention} (model "
                f"{options.model}, L={options.seq_len}): {err}"
            ) from None
        if not kernel.trains_on_cpu and not on_gpu:
            raise ConfigError(
                f"--attention {options.attention} trains on CUDA GPUs only (no backward pass on "
                "CPUs); use --attention sdpa (or auto), or --device cuda on a GPU machine"
            )
    if options.out:
        check_writable(options.out, "--out", folder=False)


def command_line(argv: list[str] | None) -> str:
    """The command as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_str = str(script.relative_to(REPO))
    except ValueError:
        script_str = str(script)
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", script_str, *args])


# --------------------------------------------------------------------------------------------
# device, precision, timing


@dataclass
class Setup:
    device: torch.device
    precision: str
    precision_reason: str
    autocast_dtype: torch.dtype | None

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.autocast_dtype or torch.float32

    def autocast(self) -> torch.autocast:
        return torch.autocast(
            self.device.type, dtype=self.compute_dtype, enabled=self.autocast_dtype is not None
        )

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def make_setup(precision: str, device: str) -> Setup:
    """Resolve `precision` on `device` as training does, keeping poslab.precision's reason."""
    dev = torch.device(device)
    capture = _Capture()
    logger = logging.getLogger("poslab.precision")
    old_level = logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        resolved = resolve_precision(precision, dev.type)
    finally:
        logger.removeHandler(capture)
        logger.setLevel(old_level)
    if precision != "auto":
        reason = f"set by --precision {precision}"
    elif capture.messages:
        reason = capture.messages[-1]
    elif dev.type == "cuda":
        reason = "precision=auto on a GPU: bf16 where torch.cuda.is_bf16_supported(), else fp16"
    else:
        reason = "precision=auto"
    return Setup(dev, resolved, reason, AUTOCAST_DTYPE[resolved])


def matmul_flops(dtype: torch.dtype, device: torch.device, size: int, repeats: int = 3) -> float:
    """Best FLOP/s of `repeats` timed (size × size) @ (size × size) products (after a warm-up)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    # a GPU product is too short to time alone: time a burst of them
    burst = 10 if device.type == "cuda" else 1
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(burst):
            torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / burst)
    return 2 * size**3 / best


def matmul_peak(
    dtype: torch.dtype, device: torch.device, max_size: int = MATMUL_SIZES[-1]
) -> tuple[float, int]:
    """(peak FLOP/s, the size that reached it): square matmuls of growing size, while the next
    size is predicted to take at most MATMUL_BUDGET_S (so an emulated dtype stays quick)."""
    best, best_size = 0.0, 0
    for size in MATMUL_SIZES:
        if size > max_size:
            break
        flops = matmul_flops(dtype, device, size)
        if flops > best:
            best, best_size = flops, size
        if 2 * (2 * size) ** 3 / flops > MATMUL_BUDGET_S:
            break
    return best, best_size


def bf16_speedup(device: torch.device) -> float:
    """bf16/fp32 matmul throughput ratio, measured: 384² on a CPU (small, since a CPU without
    bf16 instructions emulates it, several times slower), 4096² on a GPU."""
    size = 4096 if device.type == "cuda" else 384
    return matmul_flops(torch.bfloat16, device, size) / matmul_flops(torch.float32, device, size)


def train_flops_per_token(model: GPT, seq_len: int) -> float:
    """Model FLOPs of one trained token: 6·(matmul weights of the blocks + the output projection
    d·V) + 6·n_layer·d·T for causal attention (half of PaLM's 12·n_layer·d·T, since a causal
    kernel skips the masked half). Embedding lookups, norms and biases are not matmuls."""
    cfg = model.config
    weights = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    weights += cfg.d_model * cfg.vocab_size
    return 6.0 * weights + 6.0 * cfg.n_layer * cfg.d_model * seq_len


def fused_adamw(device: torch.device) -> bool | None:
    """Whether training uses the fused AdamW kernel on `device` (poslab.lit decides; older
    versions of it fuse on CUDA only)."""
    try:
        from poslab.lit import fused_adamw_supported
    except ImportError:
        return device.type == "cuda" or None
    return fused_adamw_supported(device) or None


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with training's grouping (decay on matrices only); the learning rate is irrelevant
    to speed."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": WEIGHT_DECAY},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LR, fused=fused_adamw(device))


# --------------------------------------------------------------------------------------------
# jobs: one timed unit of work each


@dataclass
class Stat:
    """Tokens/s of one job, one sample per round."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> float:
        """Half the relative range of the samples (0 with one sample)."""
        if len(self.samples) < 2:
            return 0.0
        return (max(self.samples) - min(self.samples)) / 2 / self.median


LossFn = Callable[[Tensor, Tensor], Tensor]


class TrainJob:
    """Training steps of one model on one fixed random batch."""

    def __init__(
        self,
        setup: Setup,
        module: nn.Module,
        loss_fn: LossFn,
        batch: int,
        seq_len: int,
        vocab: int,
        steps: int,
        compiled: bool = False,
    ) -> None:
        self.setup = setup
        self.module = module
        self.loss_fn = loss_fn
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(module, setup.device)
        gen = torch.Generator().manual_seed(seq_len)
        self.inputs = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(setup.device)
        self.targets = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(setup.device)
        self.steps = steps
        self.first_step_s: float | None = None
        self.compiled = compiled
        self.stat = Stat()

    @property
    def tokens_per_step(self) -> int:
        return self.inputs.numel()

    def step(self) -> None:
        # what a Lightning training step does: forward under autocast, backward outside it,
        # clipping at gradient_clip_val=1.0, optimizer step, gradients set to None
        with self.setup.autocast():
            loss = self.loss_fn(self.inputs, self.targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def warm_up(self, steps: int) -> None:
        self.module.train()
        # a compiled job compiles in its first step, which must never be timed
        for i in range(max(steps, 1 if self.compiled else 0)):
            self.setup.sync()
            start = time.perf_counter()
            self.step()
            self.setup.sync()
            if i == 0:  # includes compilation of a compiled job
                self.first_step_s = time.perf_counter() - start

    def run(self) -> None:
        self.module.train()
        self.setup.sync()
        start = time.perf_counter()
        for _ in range(self.steps):
            self.step()
        self.setup.sync()
        self.stat.samples.append(self.steps * self.tokens_per_step / (time.perf_counter() - start))


class EvalJob:
    """One pass of the real evaluation over a synthetic split at one window length."""

    def __init__(self, setup: Setup, model: GPT, split: TokenizedSplit, length: int) -> None:
        self.setup = setup
        self.model = model
        self.split = split
        self.length = length
        self.stat = Stat()

    def _score(self, split: TokenizedSplit) -> float:
        from poslab.evaluation.perplexity import score

        self.model.eval()
        result = score(
            self.model,
            split,
            self.length,
            "nonoverlapping",
            autocast_dtype=self.setup.autocast_dtype,
            progress=False,
        )
        return result.tokens / result.seconds

    def warm_up(self, steps: int) -> None:
        from poslab.data import TokenizedSplit

        if steps:  # one batch: kernel selection, allocator growth
            batch = max(1, default_batch_tokens(self.setup.device) // self.length)
            n = batch * self.length + 1
            self._score(
                TokenizedSplit(self.split.ids[:n], self.split.words[:n], self.split.bytes[:n])
            )

    def run(self) -> None:
        self.stat.samples.append(self._score(self.split))


def default_batch_tokens(device: torch.device) -> int:
    """poslab.evaluation.perplexity's default tokens per evaluation batch (imported here)."""
    from poslab.evaluation.perplexity import default_batch_tokens

    return default_batch_tokens(device)


def synthetic_split(num_tokens: int, vocab: int, seed: int = 0) -> TokenizedSplit:
    """Random token ids; every token one word and one byte (only the counts' shape matters)."""
    from poslab.data import TokenizedSplit

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, num_tokens, dtype=np.int32)
    ones = np.ones(num_tokens, dtype=np.int32)
    return TokenizedSplit(ids, ones, ones.copy())


def eval_split_tokens(options: Options, device: torch.device) -> int:
    """`eval_batches` full evaluation batches at every length: a batch holds
    default_batch_tokens (8192 on a CPU) or one window of 16·L where that is longer, rounded up
    to whole 16·L windows so that every window at every length is full; +1 for the first token,
    which is never a target."""
    long_len = options.max_len
    windows = math.ceil(default_batch_tokens(device) / long_len)
    return options.eval_batches * windows * long_len + 1


# --------------------------------------------------------------------------------------------
# x-transformers, the peer


def peer_kwargs(scheme: str, config: dict[str, Any]) -> tuple[dict, dict, str] | str:
    """(TransformerWrapper kwargs, Decoder kwargs, note) of the x-transformers model equivalent to
    poslab's `config`, or why there is none. Read against x_transformers 2.x's source."""
    m, pos = config["model"], config["pos"]
    d, heads = m["d_model"], m["n_head"]
    head_dim = d // heads
    wrapper: dict[str, Any] = {"use_abs_pos_emb": False}
    layers: dict[str, Any] = {
        "dim": d,
        "depth": m["n_layer"],
        "heads": heads,
        "attn_dim_head": head_dim,
        "ff_mult": m["d_ff"] / d,
        # flash = F.scaled_dot_product_attention, the kernel poslab uses too
        "attn_flash": True,
        "verbose": False,
    }
    note = ""
    if scheme == "nope":
        pass
    elif scheme == "learned":
        wrapper["use_abs_pos_emb"] = True  # AbsolutePositionalEmbedding(max_seq_len rows)
    elif scheme == "sinusoidal":
        wrapper.update(use_abs_pos_emb=True, scaled_sinu_pos_emb=True)
        note = "ScaledSinusoidalEmbedding (sin/cos × a learned scalar)"
    elif scheme == "rope":
        # x-transformers rotates interleaved pairs, and by default only half of each head
        layers.update(rotary_pos_emb=True, rotary_emb_dim=round(head_dim * pos.get("fraction", 1)))
    elif scheme == "alibi":
        layers["alibi_pos_bias"] = True
    elif scheme == "t5":
        layers.update(
            rel_pos_bias=True,
            rel_pos_num_buckets=pos.get("num_buckets", 32),
            rel_pos_max_distance=pos.get("max_distance", 128),
            attn_flash=False,  # x-transformers refuses flash with rel_pos_bias
        )
        note = "x-transformers' T5 bias cannot use SDPA (it asserts), so it runs its einsum path"
    else:
        return f"x-transformers has no equivalent of `{scheme}`"
    return wrapper, layers, note


def build_peer(
    scheme: str, config: dict[str, Any], vocab: int, max_seq_len: int
) -> tuple[nn.Module | None, str]:
    """The x-transformers model for `scheme` (tied embeddings, same size), or (None, why not)."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None, 'x-transformers is not installed: pip install -e ".[bench]"'
    spec = peer_kwargs(scheme, config)
    if isinstance(spec, str):
        return None, spec
    wrapper, layers, note = spec
    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=vocab,
        max_seq_len=max_seq_len,
        tie_embedding=True,
        attn_layers=Decoder(**layers),
        **wrapper,
    )
    return model, note


def peer_loss(model: nn.Module) -> LossFn:
    """Cross-entropy over the peer's logits, as x-transformers users write it."""

    def loss_fn(inputs: Tensor, targets: Tensor) -> Tensor:
        logits = model(inputs)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return loss_fn


def peer_version() -> str:
    try:
        from importlib.metadata import version

        return version("x-transformers")
    except Exception:
        return "not installed"


# --------------------------------------------------------------------------------------------
# peak memory, in fresh processes


def _rss_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {key} in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of one measurement (`spec["kind"]`: "train" = model, optimizer and two
    training steps at L; "eval" = model and one evaluation batch at 16·L), in bytes: on CUDA
    the peak of torch's allocator; on a CPU the growth of the peak resident set over the
    process's resident set before the model was built. Weights are included in both."""
    setup = make_setup(spec["precision"], spec["device"])
    torch.set_num_threads(spec["threads"])
    cuda = setup.device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats(setup.device)
        base, exact = torch.cuda.memory_allocated(setup.device), True
    else:
        base, exact = _rss_status("VmRSS"), _reset_peak_rss()
    torch.manual_seed(0)
    config = scheme_config(
        spec["model"], spec["scheme"], spec["seq_len"], spec["max_len"], spec["attention"]
    )
    model = build_model(config, spec["vocab"]).to(setup.device)
    if spec["kind"] == "train":
        job = TrainJob(
            setup, model, model.loss, spec["batch"], spec["seq_len"], spec["vocab"], steps=2
        )
        job.run()  # two steps: the first allocates AdamW's moments, the second runs with them
    else:
        length = spec["max_len"]
        batch = max(1, default_batch_tokens(setup.device) // length)
        EvalJob(setup, model, synthetic_split(batch * length + 1, spec["vocab"]), length).run()
    setup.sync()
    peak = torch.cuda.max_memory_allocated(setup.device) if cuda else _rss_status("VmHWM")
    return {"bytes": peak - base, "exact": exact}


RESULT_MARK = "benchmark-memory-result "


class MemoryServer:
    """A process (this script with `--memory-server`) that imports torch and poslab once, then
    forks a fresh child for every measurement: seconds saved per measurement, and each child's
    allocations are its own. Started early, so that its imports overlap the model building.
    (multiprocessing's forkserver would do, but its children re-run the caller's main module.)"""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--memory-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"error": "the memory server exited"}
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        return {"error": "the memory server exited"}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_memory() -> None:
    """The loop of MemoryServer's process: one JSON spec per stdin line, one forked child per
    spec, one result line on stdout. The server itself never computes (so no thread pool exists
    when it forks)."""
    import poslab.evaluation.perplexity  # noqa: F401  (the children evaluate; import it once)
    import poslab.lit  # noqa: F401  (the children's optimizer asks it; import it once here)

    for line in sys.stdin:
        spec = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report, leave without running any exit handlers
            os.close(read_end)
            try:
                result = measure_memory(spec)
            except BaseException as err:
                result = {"error": f"{type(err).__name__}: {err}"}
            os.write(write_end, json.dumps(result).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if data:
            result = json.loads(data)
        else:
            result = {"error": f"the measuring process died (wait status {status}; out of memory?)"}
        sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class SchemeResult:
    scheme: str
    flops_per_token: float
    train: Stat
    train_long: Stat  # at 16·L, same tokens per step
    eval: dict[int, Stat]  # factor -> tokens/s
    params: int = 0
    peer: Stat | None = None
    peer_note: str = ""
    peer_params: int = 0
    compiled: Stat | None = None
    compile_s: float | None = None
    peer_compiled: Stat | None = None
    peer_compile_s: float | None = None
    train_mem: dict[str, Any] | None = None
    eval_mem: dict[str, Any] | None = None
    compiled_job: TrainJob | None = None
    peer_compiled_job: TrainJob | None = None


@dataclass
class Report:
    options: Options
    setup: Setup
    machine: dict[str, str]
    peak_flops: float
    peak_size: int
    bf16_speedup: float
    results: list[SchemeResult]
    seconds: float
    date: str

    def result(self, scheme: str) -> SchemeResult | None:
        return next((r for r in self.results if r.scheme == scheme), None)

    def mfu(self, r: SchemeResult, stat: Stat | None) -> float:
        if stat is None:
            return float("nan")
        return r.flops_per_token * stat.median / self.peak_flops


def machine_info(setup: Setup) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "CPU": f"{cpu}, {os.cpu_count()} logical CPUs ({usable} usable), "
        f"torch intra-op threads {torch.get_num_threads()}",
    }
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        info["memory"] = f"{kb / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    if setup.device.type == "cuda":
        info["GPU"] = torch.cuda.get_device_name(setup.device)
    info["software"] = (
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"x-transformers {peer_version()}, {platform.system()} {platform.release()}"
    )
    return info


def build_jobs(
    options: Options, setup: Setup
) -> tuple[list[SchemeResult], list[TrainJob | EvalJob]]:
    """Every model and job, and the results their timings land in. Jobs are listed in the
    order they run in every round: for each scheme ours, then its peer (so the two see the same
    moment of the machine), compiled ones, 16·L training, evaluation."""
    L, long_len = options.seq_len, options.max_len
    long_batch = max(1, options.batch_size * L // long_len)  # same tokens per step at 16·L
    split = synthetic_split(eval_split_tokens(options, setup.device), options.vocab)

    def train_job(
        module: nn.Module,
        loss_fn: LossFn,
        batch: int = options.batch_size,
        length: int = L,
        compiled: bool = False,
    ) -> TrainJob:
        return TrainJob(
            setup, module, loss_fn, batch, length, options.vocab, options.steps, compiled
        )

    results: list[SchemeResult] = []
    jobs: list[TrainJob | EvalJob] = []
    for scheme in options.schemes:
        config = scheme_config(options.model, scheme, L, long_len, options.attention)
        torch.manual_seed(0)
        model = build_model(config, options.vocab).to(setup.device)
        train = train_job(model, model.loss)
        r = SchemeResult(scheme, train_flops_per_token(model, L), train.stat, Stat(), {})
        r.params = sum(p.numel() for p in model.parameters())
        jobs.append(train)
        peer_train = None
        if options.peer:
            peer, r.peer_note = build_peer(scheme, config, options.vocab, long_len)
            if peer is not None:
                peer = peer.to(setup.device)
                peer_train = train_job(peer, peer_loss(peer))
                r.peer = peer_train.stat
                r.peer_params = sum(p.numel() for p in peer.parameters())
                jobs.append(peer_train)
        if options.compile:
            # as trainer.compile=true does (poslab.lit): the network body compiled, the fused
            # chunked loss eager; on a copy, so that the eager jobs keep an eager model
            twin = copy.deepcopy(model)
            twin.hidden_states = torch.compile(twin.hidden_states)
            r.compiled_job = train_job(twin, twin.loss, compiled=True)
            r.compiled = r.compiled_job.stat
            jobs.append(r.compiled_job)
            if peer_train is not None:
                peer_twin = copy.deepcopy(peer_train.module)
                compiled_loss = peer_loss(torch.compile(peer_twin))
                r.peer_compiled_job = train_job(peer_twin, compiled_loss, compiled=True)
                r.peer_compiled = r.peer_compiled_job.stat
                jobs.append(r.peer_compiled_job)
        long = train_job(model, model.loss, long_batch, long_len)
        r.train_long = long.stat
        jobs.append(long)
        for factor in EVAL_FACTORS:
            job = EvalJob(setup, model, split, factor * L)
            r.eval[factor] = job.stat
            jobs.append(job)
        results.append(r)
    return results, jobs


def run_benchmark(options: Options, progress: Callable[[str], None] | None = None) -> Report:
    """Build every job, measure peak memory, then time all jobs round-robin."""
    say = progress or (lambda msg: None)
    started = time.perf_counter()
    setup = make_setup(options.precision, options.device)
    server = MemoryServer() if options.memory else None  # it imports while we build
    try:
        results, jobs = build_jobs(options, setup)
        if server is not None:
            # before any timing, which the measuring processes would compete with for the cores
            for r in results:
                spec = {
                    "scheme": r.scheme,
                    "model": options.model,
                    "seq_len": options.seq_len,
                    "max_len": options.max_len,
                    "attention": options.attention,
                    "batch": options.batch_size,
                    "vocab": options.vocab,
                    # resolved here: a child must not measure (and maybe resolve) it again
                    "precision": setup.precision,
                    "device": options.device,
                    "threads": torch.get_num_threads(),
                }
                r.train_mem = server.measure({**spec, "kind": "train"})
                r.eval_mem = server.measure({**spec, "kind": "eval"})
                say(
                    f"peak memory {r.scheme}: {_mem_cell(r.train_mem)} training at L, "
                    f"{_mem_cell(r.eval_mem)} evaluating at 16·L"
                )
    finally:
        if server is not None:
            server.close()

    say(f"warm-up: {options.warmup} steps of each of {len(jobs)} jobs")
    for job in jobs:
        job.warm_up(options.warmup)
    for r in results:
        r.compile_s = r.compiled_job.first_step_s if r.compiled_job else None
        r.peer_compile_s = r.peer_compiled_job.first_step_s if r.peer_compiled_job else None

    # the matmul peak right before and after the timings it divides, at their dtype; the
    # better of the two (a busy moment can only lower a peak)
    peak, peak_size = matmul_peak(setup.compute_dtype, setup.device, options.max_matmul)
    for i in range(options.rounds):
        round_start = time.perf_counter()
        for job in jobs:
            job.run()
        say(
            f"round {i + 1}/{options.rounds} ({time.perf_counter() - round_start:.0f} s), "
            "training tok/s: "
            + ", ".join(f"{r.scheme} {r.train.samples[-1]:,.0f}" for r in results)
        )
    after, after_size = matmul_peak(setup.compute_dtype, setup.device, options.max_matmul)
    if after > peak:
        peak, peak_size = after, after_size
    return Report(
        options=options,
        setup=setup,
        machine=machine_info(setup),
        peak_flops=peak,
        peak_size=peak_size,
        bf16_speedup=bf16_speedup(setup.device),
        results=results,
        seconds=time.perf_counter() - started,
        date=dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    )


# --------------------------------------------------------------------------------------------
# the report


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


def _tok(stat: Stat | None) -> str:
    if stat is None or not stat.samples:
        return "—"
    spread = f" ±{stat.spread:.0%}" if len(stat.samples) > 1 else ""
    return f"{stat.median:,.0f}{spread}"


def _ratio(a: Stat | None, b: Stat | None) -> float | None:
    if a is None or b is None or not a.samples or not b.samples:
        return None
    return a.median / b.median


def _x(ratio: float | None) -> str:
    return "—" if ratio is None or not math.isfinite(ratio) else f"{ratio:.2f}×"


def _s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f} s"


def _mem_cell(mem: dict[str, Any] | None) -> str:
    if not mem:
        return "—"
    if "error" in mem:
        return f"failed ({mem['error'][:60]})"
    return f"{mem['bytes'] / 1e6:,.0f} MB" + ("" if mem.get("exact", True) else " (≤)")


def _mem_bytes(mem: dict[str, Any] | None) -> float | None:
    return None if not mem or "error" in mem else float(mem["bytes"])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def render_header(report: Report) -> list[str]:
    o, s = report.options, report.setup
    lines = [
        f"- **date**: {report.date}; the run took {report.seconds / 60:.1f} min",
        f"- **command**: `{o.command}`",
        f"- **attention**: `{o.attention}`",
    ]
    lines += [f"- **{k}**: {v}" for k, v in report.machine.items()]
    lines += [
        f"- **device**: {s.device}",
        f"- **precision**: `{s.precision}` ({dtype_name(s.compute_dtype)} matmuls); why: "
        f"{s.precision_reason}",
        f"- **bf16 speed-up** (bf16/fp32 matmul throughput, measured): {report.bf16_speedup:.2f}×",
        f"- **matmul peak** at {dtype_name(s.compute_dtype)}: "
        f"{report.peak_flops / 1e9:,.1f} GFLOP/s ({report.peak_size}² matmuls, the best "
        "of timings before and after the rounds)",
        f"- **workload**: model `{o.model}`, L={o.seq_len}, batch {o.batch_size} "
        f"({o.batch_size * o.seq_len:,} tokens/step), vocab {o.vocab:,}, dropout 0; "
        f"{o.rounds} rounds × {o.steps} timed steps per job after {o.warmup} warm-up steps; "
        f"eval: {o.eval_batches} batches per length and round",
    ]
    if "learned" in o.schemes:
        lines.append(
            f"- `learned` has a table of {o.max_len} = 16·L rows (`max_positions`) in this "
            "benchmark, so it is trained and evaluated at every length; a run trained at L "
            "would have L rows and no 4×/16× evaluation"
        )
    return lines


def render_tables(report: Report) -> list[str]:
    o = report.options
    nope = report.result(REFERENCE)
    peer = o.peer
    head = "| scheme | tok/s | MFU | peak memory | vs nope |"
    rule = "|---|---:|---:|---:|---:|"
    if peer:
        head += " x-transformers tok/s | vs x-transformers |"
        rule += "---:|---:|"
    lines = [f"### Training at L={o.seq_len}", "", head, rule]
    notes = []
    for r in report.results:
        row = (
            f"| {r.scheme} | {_tok(r.train)} | {_num(report.mfu(r, r.train), '.1%')} "
            f"| {_mem_cell(r.train_mem)} "
            f"| {_x(_ratio(r.train, nope.train if nope else None))} |"
        )
        if peer:
            row += f" {_tok(r.peer)} | {_x(_ratio(r.train, r.peer))} |"
            size = (
                f"{r.params / 1e6:.2f}M parameters, x-transformers {r.peer_params / 1e6:.2f}M"
                if r.peer_params
                else ""
            )
            note = "; ".join(x for x in (size, r.peer_note) if x)
            notes.append(f"- {r.scheme}: {note}")
        lines.append(row)
    if notes:
        lines += [
            "",
            "x-transformers models (tied embeddings; its attention projections have no "
            "biases, its LayerNorms a unit-offset gain and no bias):",
            *notes,
        ]
    if o.compile:
        lines += [
            "",
            f"### Training at L={o.seq_len} with torch.compile",
            "",
            "| scheme | tok/s | MFU | vs eager | first step (compiles) |"
            + (" x-transformers tok/s | vs x-transformers | its first step |" if peer else ""),
            "|---|---:|---:|---:|---:|" + ("---:|---:|---:|" if peer else ""),
        ]
        for r in report.results:
            row = (
                f"| {r.scheme} | {_tok(r.compiled)} | {_num(report.mfu(r, r.compiled), '.1%')} "
                f"| {_x(_ratio(r.compiled, r.train))} | {_s(r.compile_s)} |"
            )
            if peer:
                ratio = _x(_ratio(r.compiled, r.peer_compiled))
                row += f" {_tok(r.peer_compiled)} | {ratio} | {_s(r.peer_compile_s)} |"
            lines.append(row)
    f_lo, f_hi = EVAL_FACTORS[0], EVAL_FACTORS[-1]
    lines += [
        "",
        f"### Evaluation (non-overlapping windows; L={o.seq_len})",
        "",
        "| scheme | "
        + " | ".join(f"eval tok/s {f}× ({f * o.seq_len})" for f in EVAL_FACTORS)
        + f" | train tok/s {f_hi}× | eval/train {f_lo}× | eval/train {f_hi}× "
        f"| peak memory {f_hi}× |",
        "|---|" + "---:|" * (len(EVAL_FACTORS) + 4),
    ]
    for r in report.results:
        cells = [_tok(r.eval[f]) for f in EVAL_FACTORS]
        cells += [
            _tok(r.train_long),
            _x(_ratio(r.eval[f_lo], r.train)),
            _x(_ratio(r.eval[f_hi], r.train_long)),
            _mem_cell(r.eval_mem),
        ]
        lines.append(f"| {r.scheme} | " + " | ".join(cells) + " |")
    return lines


@dataclass
class Target:
    name: str
    met: bool | None  # None: not measured in this run
    detail: str


def check_targets(report: Report) -> list[Target]:
    """Every target of the project's issue, with the numbers behind the verdict."""
    o = report.options
    rs = report.results
    targets: list[Target] = []

    def add(
        name: str,
        pairs: list[tuple[str, float | None]],
        ok: Callable[[float], bool],
        show: Callable[[float], str],
        missing: str = "not measured",
    ) -> None:
        measured = [(s, v) for s, v in pairs if v is not None and math.isfinite(v)]
        if not measured:
            targets.append(Target(name, None, missing))
            return
        misses = [s for s, v in measured if not ok(v)]
        detail = ", ".join(f"{s} {show(v)}" for s, v in measured)
        if misses:
            detail += f"; missed by {', '.join(misses)}"
        unmeasured = [s for s, v in pairs if v is None or not math.isfinite(v)]
        if unmeasured:
            detail += f" (not measured: {', '.join(unmeasured)})"
        targets.append(Target(name, not misses, detail))

    def times(v: float) -> str:
        return f"{v:.2f}×"

    name = f"training tok/s ≥ {TARGET_VS_PEER}× x-transformers"
    if o.peer:
        pairs = [(r.scheme, _ratio(r.train, r.peer)) for r in rs]
        add(name, pairs, lambda v: v >= TARGET_VS_PEER, times)
        if o.compile:
            pairs = [(r.scheme, _ratio(r.compiled, r.peer_compiled)) for r in rs]
            add(f"{name}, both compiled", pairs, lambda v: v >= TARGET_VS_PEER, times)
    else:
        targets.append(Target(name, None, "not measured (run with --peer)"))
    nope = report.result(REFERENCE)
    pairs = [
        (r.scheme, _ratio(r.train, nope.train if nope else None))
        for r in rs
        if r.scheme != REFERENCE
    ]
    add(
        f"training tok/s ≥ {TARGET_VS_NOPE}× nope",
        pairs,
        lambda v: v >= TARGET_VS_NOPE,
        times,
        "not measured (nope is not in --schemes)",
    )
    pairs = [(r.scheme, report.mfu(r, r.train)) for r in rs]
    add(
        f"MFU ≥ {TARGET_MFU:.0%} of the measured matmul peak",
        pairs,
        lambda v: v >= TARGET_MFU,
        lambda v: f"{v:.1%}",
    )
    name = "MFU with torch.compile higher than without (ratio compiled/eager)"
    if o.compile:
        pairs = [(r.scheme, _ratio(r.compiled, r.train)) for r in rs]
        add(name, pairs, lambda v: v > 1.0, times)
    else:
        targets.append(Target(name, None, "not measured (run with --compile)"))
    for factor, attr in ((EVAL_FACTORS[0], "train"), (EVAL_FACTORS[-1], "train_long")):
        pairs = [(r.scheme, _ratio(r.eval[factor], getattr(r, attr))) for r in rs]
        add(
            f"eval tok/s ≥ {TARGET_EVAL_OVER_TRAIN:g}× training tok/s at {factor}× L",
            pairs,
            lambda v: v >= TARGET_EVAL_OVER_TRAIN,
            times,
        )
    pairs = [(r.scheme, _mem_bytes(r.eval_mem)) for r in rs if r.scheme in TARGET_MEM_SCHEMES]
    add(
        f"peak memory at 16× L ≤ {TARGET_MEM_BYTES / 1e9:g} GB for alibi/t5 (small model)",
        pairs,
        lambda v: v <= TARGET_MEM_BYTES,
        lambda v: f"{v / 1e6:,.0f} MB",
        "not measured" if o.memory else "not measured (memory off)",
    )
    return targets


def off_target_conditions(o: Options) -> list[str]:
    """Where this run differs from the conditions the targets are set for."""
    conditions = []
    if o.model != "small":
        conditions.append(f"model `{o.model}`, not `small`")
    if o.seq_len != 256:
        conditions.append(f"L={o.seq_len}, not 256")
    if o.precision != "auto":
        conditions.append(f"precision `{o.precision}`, not `auto`")
    return conditions


def render_targets(targets: list[Target]) -> list[str]:
    verdict = {True: "met", False: "**not met**", None: "not measured"}
    return ["| target | verdict | numbers |", "|---|---|---|"] + [
        f"| {t.name} | {verdict[t.met]} | {t.detail} |" for t in targets
    ]


EXPLANATION = """\
How to read this (and how it is measured; `scripts/benchmark.py` has the code):

- **tok/s**: training tokens per second of the real training step: `model.loss` (the fused,
  chunked output projection + cross-entropy of poslab.losses), backward, gradient clipping at
  1.0, AdamW (fused where training fuses it), `zero_grad(set_to_none=True)`, forward under the
  autocast dtype of the precision; random token ids, no data loading. The median over rounds;
  ±x% is half the range of the rounds relative to the median. Every round times every job in
  turn (ours, x-transformers, the next scheme, ...), so drift of the machine hits all alike.
- **MFU**: model FLOPs per token × tok/s ÷ the matmul peak. Model FLOPs per trained token =
  6·(N + d·V) + 6·n_layer·d·T, with N the matmul weights of the blocks (q/k/v/out projections,
  MLP; no embeddings, norms or biases), d·V the tied output projection, and 6·n_layer·d·T causal
  attention (half of PaLM's 12·n_layer·d·T). The peak is the best FLOP/s of square matmuls
  timed on the same device at the same dtype in the same run.
- **peak memory**: on a CPU, the peak resident memory of a fresh process doing only this
  measurement (model built, optimizer, two training steps at L; or the model and one evaluation
  batch at 16·L), minus its resident memory before it built the model: weights, gradients,
  AdamW moments, activations and runtime overhead (the kernel's peak counter is reset first;
  "(≤)" marks an upper bound where it cannot be). On CUDA, `torch.cuda.max_memory_allocated`
  of that process. MB = 10⁶ bytes.
- **vs nope**: tok/s ÷ the tok/s of `nope` (no positional work at all).
- **x-transformers / vs x-transformers**: the same size and scheme built with x-transformers'
  `TransformerWrapper`/`Decoder` (tied embeddings, SDPA attention where it allows it), trained on
  the same batch with the same optimizer and precision, loss `F.cross_entropy` over its logits;
  the ratio is ours ÷ theirs.
- **torch.compile**: the step with `model.hidden_states` compiled, as `trainer.compile=true`
  does (the fused loss stays eager); x-transformers' whole model compiled. The first step,
  which compiles, is excluded from tok/s and shown on its own.
- **eval tok/s**: `poslab.evaluation.perplexity.score(..., "nonoverlapping")` on a synthetic
  split at 1×, 4×, 16× L: tokens scored ÷ its own clock. **train tok/s 16×**: the training step
  at 16·L with the same tokens per step (batch·L/(16·L) sequences), so **eval/train 16×**
  compares the same length; eval/train 1× uses the training row.
"""


def render_markdown(report: Report, explain: bool = False) -> str:
    lines = ["# Benchmarks", ""]
    if explain:
        lines += [EXPLANATION]
    lines += ["### Machine and run", "", *render_header(report), "", *render_tables(report)]
    lines += ["", "### Targets", ""]
    conditions = off_target_conditions(report.options)
    if conditions:
        lines += [
            "The targets are set for the `small` model, L=256 and precision `auto`; this run "
            f"differs ({'; '.join(conditions)}), so its verdicts are indicative only.",
            "",
        ]
    lines += [*render_targets(check_targets(report)), ""]
    return "\n".join(lines)


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv) == ["--memory-server"]:
        serve_memory()
        return
    options = parse_args(argv)
    check_options(options)  # before any timing: a bad setting fails in a second, not minutes in
    logging.basicConfig(level=logging.WARNING)
    report = run_benchmark(options, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(render_markdown(report))
    if options.out:
        out = Path(options.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_markdown(report, explain=True))
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
