"""Timing: the precision and device of a run, the matmul peak, and the jobs timed in rounds
(training steps, evaluation passes)."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from poslab.bench.configs import Options
from poslab.model.gpt import GPT
from poslab.model.precision import AUTOCAST_DTYPE, resolve_precision

# poslab.data and poslab.evaluation.perplexity are imported where they are used: they import
# Lightning (seconds), which a bad argument should not wait for
if TYPE_CHECKING:
    from poslab.data.tokens import TokenizedSplit

LR = 1e-4  # tiny: the benchmark only needs steps that stay finite on random tokens
WEIGHT_DECAY = 0.1
# a matmul peak is the best of these sizes that each take at most this long (bigger is faster,
# until the time budget; 2 CPU cores reach their peak around 1024-2048)
MATMUL_SIZES = (256, 512, 1024, 2048, 4096, 8192)
MATMUL_BUDGET_S = 0.5


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
    """Resolve `precision` on `device` as training does, keeping poslab.model.precision's reason."""
    dev = torch.device(device)
    capture = _Capture()
    logger = logging.getLogger("poslab.model.precision")
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
    """Whether training uses the fused AdamW kernel on `device` (poslab.run.lit decides; older
    versions of it fuse on CUDA only)."""
    try:
        from poslab.run.lit import fused_adamw_supported
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
        self.label = "training"  # what the report calls it (set where the job is planned)

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
        self.label = f"evaluation at {length}"

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

    @property
    def batch_tokens(self) -> int:
        """The tokens one evaluation batch scores (score()'s default batch at this length)."""
        return max(1, default_batch_tokens(self.setup.device) // self.length) * self.length

    def warm_up(self, steps: int) -> None:
        from poslab.data.tokens import TokenizedSplit

        if steps:  # one batch: kernel selection, allocator growth
            n = self.batch_tokens + 1
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
    from poslab.data.tokens import TokenizedSplit

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
