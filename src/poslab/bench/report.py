"""The report: machine and run, the tables, and each target of the project checked as met/not
met, in Markdown."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from poslab.bench.configs import (
    ALL_KERNELS,
    EVAL_FACTORS,
    REFERENCE,
    TARGET_EVAL_OVER_TRAIN,
    TARGET_VS_NOPE,
    Options,
)
from poslab.bench.memory import memory_cell
from poslab.bench.run import Report, SchemeResult
from poslab.bench.timing import Stat

# the project's targets for speed and memory (docs/benchmarks.md checks each)
TARGET_VS_PEER = 1.2
TARGET_MFU = 0.60
TARGET_MEM_BYTES = 2e9
TARGET_MEM_SCHEMES = ("alibi", "t5")


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


def _mem_bytes(mem: dict[str, Any] | None) -> float | None:
    return None if not mem or "error" in mem else float(mem["bytes"])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def render_header(report: Report) -> list[str]:
    o, s = report.options, report.setup
    lines = [f"- **unfinished**: {report.partial}"] if report.partial else []
    lines += [
        f"- **date**: {report.date}; the run took {report.seconds / 60:.1f} min",
        f"- **command**: `{o.command}`",
        f"- **attention**: {attention_line(o)}",
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


def attention_line(o: Options) -> str:
    if o.attention == [ALL_KERNELS]:
        return (
            "every kernel of conf/attention that serves each scheme (`--attention all`): the "
            "full tables at the scheme's default (`auto`: sdpa where it serves, else "
            "blockwise), every other kernel in the kernel table"
        )
    named = ", ".join(f"`{k}`" for k in o.attention)
    return f"{named} (the full tables at the first)"


def kernel_cell(r: SchemeResult) -> str:
    """The kernel a row was built with, and what computed it where that differs (auto's pick)."""
    if r.serving and r.serving != r.kernel:
        return f"{r.kernel} → {r.serving}"
    return r.kernel


def render_tables(report: Report) -> list[str]:
    lines = training_table(report)
    if report.options.compile:
        lines += compiled_table(report)
    return (
        lines
        + evaluation_table(report)
        + kernel_table(report)
        + mfu_bound_table(report)
        + profile_tables(report)
        + eval_profile_table(report)
    )


PROFILE_OPS = 6  # ops shown per profiled scheme


def profile_tables(report: Report, top: int = PROFILE_OPS) -> list[str]:
    """Where each scheme below TARGET_VS_NOPE × nope spends its extra time: the ops of one
    profiled training step with the most self time beyond nope's."""
    nope = report.result(REFERENCE)
    nope_profile = nope.profile if nope else None
    slow = [
        r
        for r in report.results
        if r.profile is not None and r is not nope and (r.reference_profile or nope_profile)
    ]
    if not slow:
        return []
    lines = [
        "",
        f"### Why: the schemes below {TARGET_VS_NOPE:g}× nope, profiled",
        "",
        "One training step of each under torch.profiler (self time per op, the profiler's own "
        "overhead alike in both), against one step of the nope timed in its block: the ops "
        "that take the extra time.",
    ]
    for r in slow:
        ours, base = r.profile, r.reference_profile or nope_profile or {}
        extra = sorted(ours, key=lambda op: ours[op] - base.get(op, 0.0), reverse=True)[:top]
        lines += [
            "",
            f"**{r.scheme}** ({kernel_cell(r)}, {_x(_ratio(r.train, report.reference(r)))} nope): "
            f"{sum(ours.values()):,.0f} ms per profiled step, nope {sum(base.values()):,.0f} ms",
            "",
            f"| op | {r.scheme} ms | nope ms | extra ms |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| `{op}` | {ours[op]:,.1f} | {base.get(op, 0.0):,.1f} "
            f"| {ours[op] - base.get(op, 0.0):+,.1f} |"
            for op in extra
        ]
    return lines


EVAL_PROFILE_OPS = 8  # non-matmul ops shown in the evaluation-vs-training profile
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")


MFU_BOUND_OPS = 8  # non-matmul ops shown in the account of what bounds MFU


def mfu_bound_table(report: Report, top: int = MFU_BOUND_OPS) -> list[str]:
    """What bounds MFU: one profiled training step of nope, the matmuls (forward and backward)
    against the ops with the most of the rest, each as a share of the step. MFU ÷ the matmuls'
    share is the MFU the step would reach if every other op took no time."""
    nope = report.result(REFERENCE)
    if nope is None or not nope.profile:
        return []
    total = sum(nope.profile.values())
    if total <= 0:
        return []
    matmul = sum(nope.profile.get(op, 0.0) for op in MATMUL_OPS)
    others = sorted(
        (op for op in nope.profile if op not in MATMUL_OPS), key=nope.profile.get, reverse=True
    )
    shown = others[:top]
    mfu = report.mfu(nope, nope.train)
    ceiling = mfu / (matmul / total) if matmul > 0 and math.isfinite(mfu) else float("nan")
    lines = [
        "",
        f"### What bounds MFU: one training step of {REFERENCE}, profiled",
        "",
        f"Self time per op under torch.profiler ({total:,.0f} ms for the profiled step, the "
        f"profiler's own overhead included). The matmuls take {matmul / total:.0%} of the step; "
        f"at its timed MFU of {_num(mfu, '.1%')}, a step whose other ops took no time would "
        f"reach {_num(ceiling, '.1%')}: the rest of the step, not the matmuls, is what holds "
        "MFU down where that share is small.",
        "",
        "| ops | ms | share of the step |",
        "|---|---:|---:|",
        "| matmuls (" + ", ".join(f"`{op}`" for op in MATMUL_OPS) + f") | {matmul:,.1f} "
        f"| {matmul / total:.1%} |",
    ]
    lines += [
        f"| `{op}` | {nope.profile[op]:,.1f} | {nope.profile[op] / total:.1%} |" for op in shown
    ]
    rest = sum(nope.profile[op] for op in others[top:])
    lines.append(f"| all other ops | {rest:,.1f} | {rest / total:.1%} |")
    return lines


def eval_profile_rows(
    train: dict[str, float], evaluation: dict[str, float], top: int = EVAL_PROFILE_OPS
) -> list[tuple[str, float, float]]:
    """(what, training, evaluation) per token: the matmuls together (a forward pass has a third
    of a step's matmul FLOPs), then the ops with the most evaluation time, each with its
    backward in training (`aten::gelu` + `aten::gelu_backward`), then all other ops."""

    def with_backward(times: dict[str, float], op: str) -> float:
        return sum(t for name, t in times.items() if name in (op, f"{op}_backward"))

    rows = [
        (
            "matmuls (" + ", ".join(f"`{op}`" for op in MATMUL_OPS) + ")",
            sum(train.get(op, 0.0) for op in MATMUL_OPS),
            sum(evaluation.get(op, 0.0) for op in MATMUL_OPS),
        )
    ]
    others = [op for op in evaluation if op not in MATMUL_OPS]
    shown = sorted(others, key=evaluation.get, reverse=True)[:top]
    rows += [(f"`{op}`", with_backward(train, op), evaluation[op]) for op in shown]
    counted = {*MATMUL_OPS, *shown, *(f"{op}_backward" for op in shown)}
    rows.append(
        (
            "all other ops",
            sum(t for op, t in train.items() if op not in counted),
            sum(t for op, t in evaluation.items() if op not in counted),
        )
    )
    rows.append(("all ops", sum(train.values()), sum(evaluation.values())))
    return rows


def eval_profile_table(report: Report, top: int = EVAL_PROFILE_OPS) -> list[str]:
    """Why evaluation at 1× L runs below TARGET_EVAL_OVER_TRAIN × training: nope's time per
    token in one evaluation batch beside one training step, matmuls and the other ops apart."""
    nope = report.result(REFERENCE)
    if nope is None or not nope.eval_profile or not nope.profile or not nope.train_tokens:
        return []
    per_token_train = 1e3 / nope.train_tokens  # ms per step -> µs per token
    per_token_eval = 1e3 / max(1, nope.eval_profile_tokens)
    train = {op: ms * per_token_train for op, ms in nope.profile.items()}
    evaluation = {op: ms * per_token_eval for op, ms in nope.eval_profile.items()}
    f_lo = EVAL_FACTORS[0]
    lines = [
        "",
        f"### Why: evaluation at {f_lo}× L against training, profiled ({REFERENCE})",
        "",
        f"One evaluation batch at {f_lo}× L ({nope.eval_profile_tokens:,} tokens) and one "
        f"training step ({nope.train_tokens:,} tokens) of {REFERENCE} under "
        "torch.profiler, self time per token (the profiled batch also carries the "
        "evaluation's per-call setup). A forward pass has a third of a training step's matmul "
        f"FLOPs, so evaluation reaches {TARGET_EVAL_OVER_TRAIN:g}× training only if the "
        "matmuls shrink to a third and the other ops (each with its backward in training) "
        "shrink as much: a row well below that is what holds the ratio down.",
        "",
        "| ops | training µs/token | evaluation µs/token | training ÷ evaluation |",
        "|---|---:|---:|---:|",
    ]
    for what, t, e in eval_profile_rows(train, evaluation, top):
        lines.append(f"| {what} | {t:,.2f} | {e:,.2f} | {_num(t / e if e > 0 else None, '.2f')}× |")
    return lines


def kernel_table(report: Report) -> list[str]:
    """Every other kernel that serves each scheme: training at L and evaluation at 16× L,
    against the scheme's main row; then the pairs that serve but were not timed here."""
    if not report.kernel_rows and not report.untimed:
        return []
    f_hi = EVAL_FACTORS[-1]
    L = report.options.seq_len
    lines = [
        "",
        f"### Every kernel that serves each scheme (L={L})",
        "",
        "The full tables above time each scheme at its main kernel; here every other kernel "
        "that serves it, in the same rounds. **vs main**: tok/s ÷ the same scheme's main row.",
    ]
    evaluated = report.options.kernel_eval
    if report.kernel_rows:
        head = "| scheme | kernel | tok/s | MFU | vs main | vs nope |"
        rule = "|---|---|---:|---:|---:|---:|"
        if evaluated:
            head += f" eval tok/s {f_hi}× | eval {f_hi}× vs main |"
            rule += "---:|---:|"
        lines += ["", head, rule]
        for r in report.kernel_rows:
            main = report.result(r.scheme)
            main_train = main.train if main else None
            main_eval = main.eval.get(f_hi) if main else None
            row = (
                f"| {r.scheme} | {kernel_cell(r)} | {_tok(r.train)} "
                f"| {_num(report.mfu(r, r.train), '.1%')} | {_x(_ratio(r.train, main_train))} "
                f"| {_x(_ratio(r.train, report.reference(r)))} |"
            )
            if evaluated:
                row += f" {_tok(r.eval.get(f_hi))} | {_x(_ratio(r.eval.get(f_hi), main_eval))} |"
            lines.append(row)
    if report.untimed:
        by_reason: dict[tuple[str, str], list[str]] = {}
        for u in report.untimed:
            by_reason.setdefault((u.kernel, u.reason), []).append(u.scheme)
        lines.append("")
        for (kernel, reason), schemes in by_reason.items():
            lines.append(
                f"- `{kernel}` serves {', '.join(schemes)} but {reason}: not timed on this "
                "device (`--device cuda` on a GPU times it)"
            )
    return lines


def training_table(report: Report) -> list[str]:
    """Eager training at L (with the x-transformers columns and notes of a --peer run)."""
    o = report.options
    peer = o.peer
    head = "| scheme | kernel | tok/s | MFU | peak memory | nope tok/s (its block) | vs nope |"
    rule = "|---|---|---:|---:|---:|---:|---:|"
    if peer:
        head += " x-transformers tok/s | vs x-transformers |"
        rule += "---:|---:|"
    lines = [f"### Training at L={o.seq_len}", "", head, rule]
    notes = []
    for r in report.results:
        row = (
            f"| {r.scheme} | {kernel_cell(r)} | {_tok(r.train)} "
            f"| {_num(report.mfu(r, r.train), '.1%')} | {memory_cell(r.train_mem)} "
            f"| {_tok(report.reference(r))} | {_x(_ratio(r.train, report.reference(r)))} |"
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
    return lines


def compiled_table(report: Report) -> list[str]:
    """Training at L with torch.compile (--compile), and the compiling first step."""
    peer = report.options.peer
    lines = [
        "",
        f"### Training at L={report.options.seq_len} with torch.compile",
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
    return lines


def evaluation_table(report: Report) -> list[str]:
    """Evaluation at every factor of L, against training at L and at 16·L."""
    seq_len = report.options.seq_len
    f_lo, f_hi = EVAL_FACTORS[0], EVAL_FACTORS[-1]
    lines = [
        "",
        f"### Evaluation (non-overlapping windows; L={seq_len})",
        "",
        "| scheme | "
        + " | ".join(f"eval tok/s {f}× ({f * seq_len})" for f in EVAL_FACTORS)
        + f" | train tok/s {f_hi}× | eval/train {f_lo}× | eval/train {f_hi}× "
        f"| eval MFU {f_lo}× | eval MFU {f_hi}× | peak memory {f_hi}× |",
        "|---|" + "---:|" * (len(EVAL_FACTORS) + 6),
    ]
    for r in report.results:
        cells = [_tok(r.eval[f]) for f in EVAL_FACTORS]
        cells += [
            _tok(r.train_long),
            _x(_ratio(r.eval[f_lo], r.train)),
            _x(_ratio(r.eval[f_hi], r.train_long)),
            _num(report.eval_mfu(r, f_lo), ".1%"),
            _num(report.eval_mfu(r, f_hi), ".1%"),
            memory_cell(r.eval_mem),
        ]
        lines.append(f"| {r.scheme} | " + " | ".join(cells) + " |")
    return lines


@dataclass
class Target:
    name: str
    met: bool | None  # None: not measured in this run
    detail: str


def verdict(
    name: str,
    pairs: list[tuple[str, float | None]],
    ok: Callable[[float], bool],
    show: Callable[[float], str],
    missing: str = "not measured",
) -> Target:
    """A target met where every measured (scheme, value) pair is `ok`, with the numbers; pairs
    with no finite value are listed as not measured."""
    measured = [(s, v) for s, v in pairs if v is not None and math.isfinite(v)]
    if not measured:
        return Target(name, None, missing)
    misses = [s for s, v in measured if not ok(v)]
    detail = ", ".join(f"{s} {show(v)}" for s, v in measured)
    if misses:
        detail += f"; missed by {', '.join(misses)}"
    unmeasured = [s for s, v in pairs if v is None or not math.isfinite(v)]
    if unmeasured:
        detail += f" (not measured: {', '.join(unmeasured)})"
    return Target(name, not misses, detail)


def _times(v: float) -> str:
    return f"{v:.2f}×"


def check_targets(report: Report) -> list[Target]:
    """Every target of the project, with the numbers behind the verdict."""
    o = report.options
    rs = report.results
    targets: list[Target] = []

    def add(*args: Any) -> None:
        targets.append(verdict(*args))

    times = _times
    name = f"training tok/s ≥ {TARGET_VS_PEER}× x-transformers"
    if o.peer:
        pairs = [(r.scheme, _ratio(r.train, r.peer)) for r in rs]
        add(name, pairs, lambda v: v >= TARGET_VS_PEER, times)
        if o.compile:
            pairs = [(r.scheme, _ratio(r.compiled, r.peer_compiled)) for r in rs]
            add(f"{name}, both compiled", pairs, lambda v: v >= TARGET_VS_PEER, times)
    else:
        targets.append(Target(name, None, "not measured (run with --peer)"))
    pairs = [(r.scheme, _ratio(r.train, report.reference(r))) for r in rs if r.scheme != REFERENCE]
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
  chunked output projection + cross-entropy of poslab.model.losses), backward, gradient clipping at
  1.0, AdamW (fused where training fuses it), `zero_grad(set_to_none=True)`, forward under the
  autocast dtype of the precision; random token ids, no data loading. The median over rounds;
  ±x% is half the range of the rounds relative to the median. Every round times every job of
  a scheme's block in turn (nope, ours, x-transformers, the other kernels, ...), so drift of
  the machine hits all of them alike.
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
- **vs nope**: tok/s ÷ the tok/s of `nope` (no positional work at all) timed in the same
  block: the schemes run one at a time, each scheme's jobs (every kernel, the peer, compiled,
  16·L, evaluation) built beside a fresh nope, timed round-robin with it, and freed before the
  next scheme's, so that the machine holds a few models rather than every scheme's at once.
- **x-transformers / vs x-transformers**: the same size and scheme built with x-transformers'
  `TransformerWrapper`/`Decoder` (tied embeddings, SDPA attention where it allows it), trained on
  the same batch with the same optimizer and precision, loss `F.cross_entropy` over its logits;
  the ratio is ours ÷ theirs.
- **torch.compile**: the step with `model.hidden_states` compiled, as `trainer.compile=true`
  does (the fused loss stays eager); x-transformers' whole model compiled. The first step,
  which compiles, is excluded from tok/s and shown on its own.
- **eval tok/s**: `poslab.evaluation.perplexity.score(..., "nonoverlapping")` on a synthetic
  split at 1×, 4×, 16× L: tokens scored ÷ its own clock. **train tok/s 16×**: the training
  step at 16·L with the same tokens per step (batch·L/(16·L) sequences; one step per round),
  so **eval/train 16×** compares the same length; eval/train 1× uses the training row.
  **eval MFU**: forward FLOPs per token (a third of training's: 2·(N + d·V) + 2·n_layer·d·T
  at that length) × eval tok/s ÷ the matmul peak. A forward pass is a third of a step's
  FLOPs, so eval/train ≥ 3× needs evaluation to run at training's MFU or better.
- **kernels**: `--attention all` (the default) times every kernel of conf/attention that
  serves each scheme: the full tables at the scheme's default kernel (`auto`), the others in
  the kernel table (training at L, the same rounds; with `--kernel-eval` also evaluation at
  16× L); a kernel
  that cannot train on the device (flex on a CPU) is listed, not timed.
- **profiles**: every scheme below the vs-nope target gets one training step under
  torch.profiler beside one of its block's nope, and the page lists the ops with the most
  extra time.
  When evaluation at 1× L runs below 3× training, one evaluation batch of nope is profiled
  beside one training step of it, per token: the ops that do not shrink to a third. And one
  training step of nope always, for what bounds MFU: the matmuls' share of the step, the ops
  that take the rest, and the MFU a step would reach if only its matmuls took time.
"""


def render_markdown(report: Report, explain: bool = False) -> str:
    lines = ["# Benchmarks", ""]
    if explain:
        lines += [EXPLANATION]
    lines += ["### Machine and run", "", *render_header(report), "", *render_tables(report)]
    if report.failed:
        lines += ["", "### Jobs that failed (left out of the timings; their cells read nan)", ""]
        lines += [f"- {what}" for what in report.failed]
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
