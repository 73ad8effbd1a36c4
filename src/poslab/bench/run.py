"""The benchmark run: every job built, peak memory measured, then all jobs timed round-robin."""

from __future__ import annotations

import copy
import datetime as dt
import gc
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from poslab.bench.configs import (
    DEFAULT_KERNEL,
    EVAL_FACTORS,
    REFERENCE,
    TARGET_EVAL_OVER_TRAIN,
    TARGET_VS_NOPE,
    Options,
    Pairing,
    Untimed,
    scheme_config,
)
from poslab.bench.memory import InProcessMeasure, MemoryServer, memory_cell
from poslab.bench.peer import build_peer, peer_loss, peer_version
from poslab.bench.timing import (
    EvalJob,
    LossFn,
    Setup,
    Stat,
    TrainJob,
    bf16_speedup,
    eval_split_tokens,
    make_setup,
    matmul_peak,
    synthetic_split,
    train_flops_per_token,
)
from poslab.model.build import build_model
from poslab.model.precision import cpu_name

if TYPE_CHECKING:
    from poslab.data.tokens import TokenizedSplit


@dataclass
class SchemeResult:
    scheme: str
    flops_per_token: float
    train: Stat
    train_long: Stat  # at 16·L, same tokens per step
    eval: dict[int, Stat]  # factor -> tokens/s
    kernel: str = DEFAULT_KERNEL  # conf/attention name the model was built with
    serving: str = ""  # the kernel that computed (auto's pick)
    main: bool = True  # a row of the full tables; else of the kernel table
    eval_flops: dict[int, float] = field(default_factory=dict)  # factor -> forward FLOPs/token
    train_job: TrainJob | None = None
    profile: dict[str, float] | None = None  # op -> ms of self time in one training step
    eval_job: EvalJob | None = None  # the evaluation at 1× L
    # op -> ms of self time in one evaluation batch at 1× L, and the tokens it scored
    eval_profile: dict[str, float] | None = None
    eval_profile_tokens: int = 0
    params: int = 0
    train_tokens: int = 0  # tokens per training step at L
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
    # nope timed in this scheme's block (the same rounds), and its profile beside this one's
    reference: Stat | None = None
    reference_profile: dict[str, float] | None = None


@dataclass
class Report:
    options: Options
    setup: Setup
    machine: dict[str, str]
    peak_flops: float
    peak_size: int
    bf16_speedup: float
    results: list[SchemeResult]  # each scheme at its main kernel
    seconds: float
    date: str
    kernel_rows: list[SchemeResult] = field(default_factory=list)  # every other kernel
    untimed: list[Untimed] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # jobs that could not run: what and why
    # while the run goes on: which schemes it has timed so far, of how many ("" when done)
    partial: str = ""

    def result(self, scheme: str) -> SchemeResult | None:
        return next((r for r in self.results if r.scheme == scheme), None)

    def reference(self, r: SchemeResult) -> Stat | None:
        """nope's training tok/s to divide r's by: the nope timed in r's own block, else the
        nope row's."""
        if r.reference is not None:
            return r.reference
        nope = self.result(REFERENCE)
        return nope.train if nope else None

    def mfu(self, r: SchemeResult, stat: Stat | None) -> float:
        if stat is None:
            return float("nan")
        return r.flops_per_token * stat.median / self.peak_flops

    def eval_mfu(self, r: SchemeResult, factor: int) -> float:
        stat = r.eval.get(factor)
        if stat is None or factor not in r.eval_flops:
            return float("nan")
        return r.eval_flops[factor] * stat.median / self.peak_flops


def machine_info(setup: Setup) -> dict[str, str]:
    cpu = cpu_name()
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
    options: Options, setup: Setup, pairs: list[Pairing]
) -> tuple[list[SchemeResult], list[TrainJob | EvalJob]]:
    """Every model and job, and the results their timings land in. Jobs are listed in the
    order they run in every round: for each scheme's main kernel ours, then its peer (so the two
    see the same moment of the machine), compiled ones, 16·L training, evaluation; then the
    scheme's other kernels (training at L; evaluation at 16× L with --kernel-eval)."""
    split = synthetic_split(eval_split_tokens(options, setup.device), options.vocab)
    results: list[SchemeResult] = []
    jobs: list[TrainJob | EvalJob] = []
    for pair in pairs:
        r, pair_jobs = _pair_jobs(options, setup, pair, split)
        results.append(r)
        jobs += pair_jobs
    return results, jobs


def _train_job(
    options: Options,
    setup: Setup,
    module: nn.Module,
    loss_fn: LossFn,
    batch: int | None = None,
    length: int | None = None,
    compiled: bool = False,
    steps: int | None = None,
) -> TrainJob:
    """A training job at the options' batch size, L and steps unless told otherwise: one place
    for the defaults that every job of a pair shares."""
    return TrainJob(
        setup,
        module,
        loss_fn,
        options.batch_size if batch is None else batch,
        options.seq_len if length is None else length,
        options.vocab,
        options.steps if steps is None else steps,
        compiled,
    )


def _pair_jobs(
    options: Options, setup: Setup, pair: Pairing, split: TokenizedSplit
) -> tuple[SchemeResult, list[TrainJob | EvalJob]]:
    """One scheme at one kernel: its result and its jobs in run order (build_jobs's)."""
    L, long_len = options.seq_len, options.max_len
    jobs: list[TrainJob | EvalJob] = []

    def add(job: TrainJob | EvalJob, what: str) -> None:
        job.label = f"{pair.scheme} ({pair.kernel}), {what}"
        jobs.append(job)

    config = scheme_config(options.model, pair.scheme, L, long_len, pair.kernel)
    torch.manual_seed(0)
    model = build_model(config, options.vocab).to(setup.device)
    train = _train_job(options, setup, model, model.loss)
    r = SchemeResult(pair.scheme, train_flops_per_token(model, L), train.stat, Stat(), {})
    r.kernel, r.serving, r.main = pair.kernel, pair.serving, pair.main
    r.train_job, r.train_tokens = train, train.tokens_per_step
    # a forward pass is a third of a training step's FLOPs (6 -> 2 per weight and pair)
    r.eval_flops = {f: train_flops_per_token(model, f * L) / 3 for f in EVAL_FACTORS}
    r.params = sum(p.numel() for p in model.parameters())
    add(train, f"training at L={L}")
    if not pair.main:  # the kernel table: training at L (with --kernel-eval, eval at 16× L)
        if options.kernel_eval:
            job = EvalJob(setup, model, split, EVAL_FACTORS[-1] * L)
            r.eval[EVAL_FACTORS[-1]] = job.stat
            add(job, f"evaluation at {EVAL_FACTORS[-1] * L}")
        return r, jobs
    peer_train = _peer_job(options, setup, r, config) if options.peer else None
    if peer_train is not None:
        add(peer_train, "x-transformers training")
    if options.compile:
        for job, what in _compiled_jobs(options, setup, r, model, peer_train):
            add(job, what)
    # one step per round: at 16·L a step of the slow schemes (DAPE, FIRE, CoPE) takes
    # tens of seconds on a CPU, and eval/train 16× needs its rate, not many samples
    long_batch = max(1, options.batch_size * L // long_len)  # same tokens per step at 16·L
    long = _train_job(options, setup, model, model.loss, long_batch, long_len, steps=1)
    r.train_long = long.stat
    add(long, f"training at {long_len}")
    for factor in EVAL_FACTORS:
        job = EvalJob(setup, model, split, factor * L)
        r.eval[factor] = job.stat
        r.eval_job = r.eval_job or job
        add(job, f"evaluation at {factor * L}")
    return r, jobs


def _peer_job(
    options: Options, setup: Setup, r: SchemeResult, config: dict[str, Any]
) -> TrainJob | None:
    """The x-transformers peer of r's scheme training at L (None where it has none: r's
    peer_note says why); its timing and size land in r."""
    peer, r.peer_note = build_peer(r.scheme, config, options.vocab, options.max_len)
    if peer is None:
        return None
    peer = peer.to(setup.device)
    peer_train = _train_job(options, setup, peer, peer_loss(peer))
    r.peer = peer_train.stat
    r.peer_params = sum(p.numel() for p in peer.parameters())
    return peer_train


def _compiled_jobs(
    options: Options,
    setup: Setup,
    r: SchemeResult,
    model: nn.Module,
    peer_train: TrainJob | None,
) -> list[tuple[TrainJob, str]]:
    """The compiled twins of the model's (and the peer's) training job, with what each is.
    As trainer.compile=true does (poslab.run.lit): the network body compiled, the fused
    chunked loss eager; on a copy, so that the eager jobs keep an eager model."""
    twin = copy.deepcopy(model)
    twin.hidden_states = torch.compile(twin.hidden_states)
    r.compiled_job = _train_job(options, setup, twin, twin.loss, compiled=True)
    r.compiled = r.compiled_job.stat
    jobs = [(r.compiled_job, "compiled training")]
    if peer_train is not None:
        peer_twin = copy.deepcopy(peer_train.module)
        compiled_loss = peer_loss(torch.compile(peer_twin))
        r.peer_compiled_job = _train_job(options, setup, peer_twin, compiled_loss, compiled=True)
        r.peer_compiled = r.peer_compiled_job.stat
        jobs.append((r.peer_compiled_job, "x-transformers compiled training"))
    return jobs


def scheme_blocks(pairs: list[Pairing]) -> list[list[Pairing]]:
    """The pairs grouped by scheme, in plan order: one block of jobs in memory at a time."""
    blocks: dict[str, list[Pairing]] = {}
    for pair in pairs:
        blocks.setdefault(pair.scheme, []).append(pair)
    return list(blocks.values())


def run_benchmark(
    options: Options,
    progress: Callable[[str], None] | None = None,
    on_block: Callable[[Report], None] | None = None,
) -> Report:
    """Time the schemes one block at a time: a scheme's jobs (every kernel, the peer,
    compiled, 16·L, evaluation) and a fresh `nope` at L, built, their peak memory measured,
    warmed up and timed round-robin, then freed before the next scheme's.

    Holding every job of every scheme at once (164 models with their AdamW states, 16.5 GB of
    23.5 on the 2-core CPU) made the machine page-fault through the rounds, and ratios to nope
    moved by ±20%. Within a block, nope is timed in the same rounds as the scheme, so every
    "vs nope" divides by a nope measured at the same moment of the machine. After each block,
    `on_block` gets the report so far (`partial` says how far), so that a stopped run keeps
    what it measured."""
    # poslab.model.build: not needed by what imports this module's types
    from poslab.bench.plan import plan

    say = progress or (lambda msg: None)
    started = time.perf_counter()
    setup = make_setup(options.precision, options.device)
    pairs, untimed = plan(options)
    # nope's main kernel: the reference of every block runs on it, as the nope row does
    nope_kernel = next((p.kernel for p in pairs if p.scheme == REFERENCE and p.main), None)
    server: MemoryServer | InProcessMeasure | None = None
    if options.memory:  # a server of fresh processes on a CPU (peak RSS), imports while we build
        server = InProcessMeasure() if setup.device.type == "cuda" else MemoryServer()
    everything: list[SchemeResult] = []
    failed: list[str] = []
    # the matmul peak before and after the timings it divides, at their dtype; the better of
    # the two (a busy moment can only lower a peak)
    peak, peak_size = matmul_peak(setup.compute_dtype, setup.device, options.max_matmul)

    def report(partial: str = "") -> Report:  # at the peak as it stands: rebound at the end
        return _report(
            options, setup, untimed, everything, failed, started, (peak, peak_size), bf16, partial
        )

    bf16 = bf16_speedup(setup.device)
    blocks = scheme_blocks(pairs)
    nope_block = _time_blocks(
        options, setup, blocks, server, nope_kernel, everything, failed, say, on_block, report
    )
    after, after_size = matmul_peak(setup.compute_dtype, setup.device, options.max_matmul)
    if after > peak:
        peak, peak_size = after, after_size
    results = [r for r in everything if r.main]
    profile_evaluation(results, say)
    profile_training(results, say)
    release(nope_block)
    return report()


def _report(
    options: Options,
    setup: Setup,
    untimed: list[Untimed],
    everything: list[SchemeResult],
    failed: list[str],
    started: float,
    peak: tuple[float, int],
    bf16: float,
    partial: str = "",
) -> Report:
    """The report of what is timed so far (main rows and kernel rows apart), with the machine,
    seconds and date of this moment: run_benchmark makes one after each block and at the end."""
    return Report(
        options=options,
        setup=setup,
        machine=machine_info(setup),
        peak_flops=peak[0],
        peak_size=peak[1],
        bf16_speedup=bf16,
        results=[r for r in everything if r.main],
        seconds=time.perf_counter() - started,
        date=dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        kernel_rows=[r for r in everything if not r.main],
        untimed=untimed,
        failed=failed,
        partial=partial,
    )


def _time_blocks(
    options: Options,
    setup: Setup,
    blocks: list[list[Pairing]],
    server: MemoryServer | InProcessMeasure | None,
    nope_kernel: str | None,
    everything: list[SchemeResult],
    failed: list[str],
    say: Callable[[str], None],
    on_block: Callable[[Report], None] | None,
    report: Callable[[str], Report],
) -> list[SchemeResult]:
    """Every block timed in turn (_time_block), its results added to `everything` and its
    warm-up failures to `failed`, its jobs freed, and the report so far handed to `on_block`
    after each block but the last; the memory server closed at the end, however it ends.
    Returns nope's main rows, whose models stay for the evaluation profile."""
    nope_block: list[SchemeResult] = []
    try:
        for done, block in enumerate(blocks, 1):
            block_results, block_failed = _time_block(
                options, setup, block, server, nope_kernel, say
            )
            failed += block_failed
            everything += block_results
            if block[0].scheme == REFERENCE:
                nope_block = _keep_nope(block_results)
            else:
                release(block_results)
            if on_block is not None and done < len(blocks):
                try:
                    on_block(report(f"{done} of {len(blocks)} schemes timed so far"))
                except Exception as err:  # a page that cannot be written stops no measurement
                    say(f"the report so far was not written: {type(err).__name__}: {err}")
    finally:
        if server is not None:
            server.close()
    return nope_block


def _time_block(
    options: Options,
    setup: Setup,
    block: list[Pairing],
    server: MemoryServer | InProcessMeasure | None,
    nope_kernel: str | None,
    say: Callable[[str], None],
) -> tuple[list[SchemeResult], list[str]]:
    """One scheme's block built, its peak memory measured, warmed up and timed round-robin
    beside a fresh nope on `nope_kernel` (none in nope's own block, or without a nope row):
    its results, and the jobs that failed in warm-up. The jobs go when this returns, so that
    only the results' own references hold the models."""
    scheme = block[0].scheme
    block_results, jobs = build_jobs(options, setup, block)
    if server is not None:
        # before the block's timing, which the measuring processes would compete with
        measure_peaks(server, [r for r in block_results if r.main], options, setup, say)
    reference = None
    if nope_kernel is not None and scheme != REFERENCE:
        reference = reference_job(options, setup, nope_kernel)
        jobs.insert(0, reference)
    say(f"{scheme}: warm-up of {len(jobs)} jobs ({options.warmup} steps each)")
    jobs, failed = warm_up_all(jobs, options.warmup, say)
    if reference is not None and reference not in jobs:
        reference = None
    _time_rounds(options, scheme, jobs, block_results, reference, say)
    for r in block_results:
        r.compile_s = r.compiled_job.first_step_s if r.compiled_job else None
        r.peer_compile_s = r.peer_compiled_job.first_step_s if r.peer_compiled_job else None
        if reference is not None:
            r.reference = reference.stat
    if reference is not None:
        profile_if_slow(block_results, reference, say)
    return block_results, failed


def _time_rounds(
    options: Options,
    scheme: str,
    jobs: list[TrainJob | EvalJob],
    results: list[SchemeResult],
    reference: TrainJob | None,
    say: Callable[[str], None],
) -> None:
    """`options.rounds` rounds of every job once, in order, each round's training tok/s said."""
    for i in range(options.rounds):
        round_start = time.perf_counter()
        for job in jobs:
            job.run()
        ours = [r for r in results if r.train.samples]
        say(
            f"{scheme}: round {i + 1}/{options.rounds} "
            f"({time.perf_counter() - round_start:.0f} s), training tok/s: "
            + ", ".join(f"{r.kernel} {r.train.samples[-1]:,.0f}" for r in ours)
            + (f", {REFERENCE} {reference.stat.samples[-1]:,.0f}" if reference else "")
        )


def _keep_nope(results: list[SchemeResult]) -> list[SchemeResult]:
    """nope's block freed but for its main row's training and evaluation (one model): its
    evaluation may be profiled at the end of the run. Returns the rows kept."""
    kept = [r for r in results if r.main]
    for r in kept:
        r.compiled_job = r.peer_compiled_job = None
    release([r for r in results if not r.main])
    return kept


def reference_job(options: Options, setup: Setup, kernel: str) -> TrainJob:
    """A fresh nope on the nope row's kernel, training at L: the block's reference."""
    config = scheme_config(options.model, REFERENCE, options.seq_len, options.max_len, kernel)
    torch.manual_seed(0)
    model = build_model(config, options.vocab).to(setup.device)
    job = TrainJob(
        setup,
        model,
        model.loss,
        options.batch_size,
        options.seq_len,
        options.vocab,
        options.steps,
        False,
    )
    job.label = f"{REFERENCE} (reference), training at L={options.seq_len}"
    return job


def release(results: list[SchemeResult]) -> None:
    """Drop the models and optimizer states the results' jobs hold (their timings stay)."""
    for r in results:
        r.train_job = r.eval_job = r.compiled_job = r.peer_compiled_job = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def warm_up_all(
    jobs: list[TrainJob | EvalJob], steps: int, say: Callable[[str], None]
) -> tuple[list[TrainJob | EvalJob], list[str]]:
    """Warm every job up; one that fails (a kernel that does not compile on this device, say)
    is left out of the timings and named in the report, and the other jobs still run: on the
    first GPU run one scheme's compile error ended the whole benchmark."""
    ready, failed = [], []
    for job in jobs:
        try:
            job.warm_up(steps)
        except Exception as err:
            reason = (str(err).strip().splitlines() or [""])[0][:160]
            failed.append(f"{job.label}: {type(err).__name__}: {reason}")
            say(f"left out, failed in warm-up: {failed[-1]}")
            continue
        ready.append(job)
    return ready, failed


def measure_peaks(
    server: MemoryServer | InProcessMeasure,
    results: list[SchemeResult],
    options: Options,
    setup: Setup,
    say: Callable[[str], None],
) -> None:
    """Peak memory of every scheme, training at L and evaluating at 16·L, into its result."""
    for r in results:
        spec = {
            "scheme": r.scheme,
            "model": options.model,
            "seq_len": options.seq_len,
            "max_len": options.max_len,
            "attention": r.kernel,
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
            f"peak memory {r.scheme}: {memory_cell(r.train_mem)} training at L, "
            f"{memory_cell(r.eval_mem)} evaluating at 16·L"
        )


def op_times(job: TrainJob | EvalJob) -> dict[str, float]:
    """Self time (ms) of every op in one training step of `job`, or in one evaluation batch
    of an EvalJob, by op name (torch.profiler; device time on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = job.setup.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if isinstance(job, TrainJob):
        job.module.train()
    with profile(activities=activities) as prof:
        if isinstance(job, TrainJob):
            job.step()
        else:
            job.warm_up(1)  # one batch of the real evaluation
        job.setup.sync()
    return {
        e.key: (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3
        for e in prof.key_averages()
    }


def profile_evaluation(results: list[SchemeResult], say: Callable[[str], None]) -> None:
    """Where a forward pass spends its time next to a training step: one evaluation batch
    at 1× L of nope beside one training step of it, when some row's evaluation at 1× L runs
    below TARGET_EVAL_OVER_TRAIN × its training (the page shows the ops per token)."""
    nope = next((r for r in results if r.scheme == REFERENCE), None)
    if nope is None or nope.train_job is None or nope.eval_job is None:
        return
    factor = EVAL_FACTORS[0]
    if not any(
        r.train.samples
        and factor in r.eval
        and r.eval[factor].samples
        and r.eval[factor].median < TARGET_EVAL_OVER_TRAIN * r.train.median
        for r in results
    ):
        return
    say(f"profiling one evaluation batch and one training step of {REFERENCE}")
    nope.profile = nope.profile or op_times(nope.train_job)
    nope.eval_profile = op_times(nope.eval_job)
    nope.eval_profile_tokens = nope.eval_job.batch_tokens


def profile_training(results: list[SchemeResult], say: Callable[[str], None]) -> None:
    """One training step of nope under torch.profiler, for the page's account of what bounds
    MFU: the matmuls' share of the step and the other ops that take the rest."""
    nope = next((r for r in results if r.scheme == REFERENCE), None)
    if nope is None or nope.train_job is None or nope.profile is not None:
        return
    say(f"profiling one training step of {REFERENCE}")
    nope.profile = op_times(nope.train_job)


def profile_if_slow(
    results: list[SchemeResult], reference: TrainJob, say: Callable[[str], None]
) -> None:
    """A profile of one training step of every row of a block below TARGET_VS_NOPE × the
    block's nope, beside one step of that nope: the page shows which ops take the extra time."""
    slow = [
        r
        for r in results
        if r.main
        and r.train_job
        and r.train.samples
        and reference.stat.samples
        and r.train.median < TARGET_VS_NOPE * reference.stat.median
    ]
    if not slow:
        return
    say(f"profiling one training step of {', '.join(r.scheme for r in slow)} and {REFERENCE}")
    base = op_times(reference)
    for r in slow:
        r.profile, r.reference_profile = op_times(r.train_job), base
