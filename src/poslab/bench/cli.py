"""Speed and memory of every positional scheme: training, evaluation, and against x-transformers.

    python scripts/benchmark.py                      # small model, L=256, every scheme in conf/pos
    python scripts/benchmark.py --peer --compile     # + x-transformers (pip install -e ".[bench]")
    python scripts/benchmark.py --model tiny --steps 1 --rounds 1 --schemes nope rope \\
        --out /tmp/bench.md                          # a smoke run

For every scheme (the stems of conf/pos/*.yaml) it measures

* training tokens/s at the training length L: exactly the step training takes (`model.loss`, the
  fused chunked cross-entropy; backward; gradient clipping at 1.0; AdamW; zero_grad), under the
  autocast dtype of `--precision` (default `auto`, resolved by poslab.model.precision), on random
  token ids; the model FLOPs utilisation (MFU) of that step against the peak matmul throughput
  measured on the device, at the same dtype, in the same run; peak memory of the step;
* training tokens/s at 16·L with the same tokens per step, so that evaluation and training
  compare like with like at 16×;
* evaluation tokens/s of the real evaluation (`poslab.evaluation.perplexity.score`,
  non-overlapping windows) at 1×, 4× and 16× L, and peak memory at 16× L;
* with `--peer`, the same size and scheme built with x-transformers, trained with the same
  batch, loss (cross-entropy over its logits), optimizer and precision;
* with `--compile`, the training step compiled as `trainer.compile=true` compiles it.

The schemes run one block at a time: a scheme's jobs (every kernel, the peer, compiled, 16·L,
evaluation) and a fresh `nope` are built, timed, and freed before the next scheme's, so that
the machine holds a few models, not every scheme's (all at once, they filled 16.5 GB of a
23.5 GB machine and the page faults moved the ratios by ±20%). Within a block measurements
alternate: every round times k steps of every job in turn (nope, ours, the peer, ...), and each
job reports its median over the rounds, so that drift of a shared machine hits all of them
alike, and "vs nope" divides by the nope of the same block. Peak memory is measured in fresh
processes (forked from a server that has only imported torch and poslab), one per measurement,
so that no allocation of another measurement can hide in it.

The report (machine, command, tables, and each target of the project checked as met/not met)
is printed and written to `--out` (default outputs/benchmarks.md; `--out docs/benchmarks.md` for the
committed page; `--out ''` writes nothing).

A bad option (an unknown model, scheme or kernel, a count below 1, a device this machine lacks, a
scheme the kernel cannot serve, an --out that cannot be written) ends with one `error: ...` line
on stderr and exit code 2 before any measurement.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

import torch

from poslab.arguments import OneLineParser, at_least, check_writable
from poslab.bench.configs import Options, available_schemes, config_names
from poslab.bench.memory import serve_memory
from poslab.bench.plan import kernel_choices, plan
from poslab.bench.report import check_targets, render_markdown
from poslab.bench.run import Report, run_benchmark
from poslab.errors import exit_on_config_error
from poslab.model.precision import PRECISIONS

# what tests and notebooks use of the benchmark, besides main
__all__ = [
    "Options",
    "available_schemes",
    "check_targets",
    "main",
    "render_markdown",
    "run_benchmark",
]


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
    args = parser().parse_args(argv)
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
        attention=list(dict.fromkeys(args.attention)),
        device=args.device,
        peer=args.peer,
        compile=args.compile,
        out=args.out,
        eval_batches=args.eval_batches,
        kernel_eval=args.kernel_eval,
        command=command_line(argv),
    )


def parser() -> argparse.ArgumentParser:
    """Every option, with Options' defaults."""
    defaults = Options()
    p = OneLineParser(
        prog="scripts/benchmark.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    positive = at_least(1)
    p.add_argument(
        "--model",
        default=defaults.model,
        choices=config_names("model"),
        help="conf/model/<name>.yaml",
    )
    p.add_argument("--seq-len", type=positive, default=defaults.seq_len, help="training length L")
    p.add_argument("--batch-size", type=positive, default=defaults.batch_size)
    p.add_argument("--vocab", type=positive, default=defaults.vocab)
    p.add_argument("--steps", type=positive, default=defaults.steps, help="timed steps per round")
    p.add_argument(
        "--warmup", type=at_least(0), default=defaults.warmup, help="untimed steps first"
    )
    p.add_argument("--rounds", type=positive, default=defaults.rounds)
    p.add_argument(
        "--schemes",
        nargs="+",
        default=defaults.schemes,
        choices=available_schemes(),
        metavar="SCHEME",
        help="default: every scheme of conf/pos",
    )
    p.add_argument("--precision", default=defaults.precision, choices=PRECISIONS)
    p.add_argument(
        "--attention",
        nargs="+",
        default=defaults.attention,
        choices=kernel_choices(),
        metavar="KERNEL",
        help="all (default): every kernel of conf/attention that serves each scheme, the "
        "scheme's `auto` pick in the full tables; or kernels by name, the first in the full "
        "tables, each serving every scheme",
    )
    p.add_argument("--device", type=device_arg, default=defaults.device, help="cpu or cuda[:N]")
    p.add_argument("--peer", action="store_true", help="also time x-transformers")
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd steps")
    p.add_argument("--out", default=defaults.out, help="Markdown report ('' = none)")
    p.add_argument("--eval-batches", type=positive, default=defaults.eval_batches)
    p.add_argument(
        "--kernel-eval",
        action="store_true",
        help="also time evaluation at 16·L for every row of the kernel table (slow on a CPU)",
    )
    return p


def check_options(options: Options) -> None:
    """What would fail part-way through the benchmark, found before any work: a scheme that a
    named kernel cannot serve or that cannot represent 16·L positions, a named kernel that
    cannot train on the device, a report path that cannot be written."""
    plan(options)
    if options.out:
        check_writable(options.out, "--out", folder=False)


def command_line(argv: list[str] | None) -> str:
    """The command as it was typed: `python scripts/benchmark.py …` (the path as given, relative
    to the folder it ran from), `poslab-bench …` or `python -m poslab.bench …`."""
    script = Path(sys.argv[0])
    args = sys.argv[1:] if argv is None else argv
    if script.name.startswith("poslab-"):  # an installed console script
        return shlex.join([script.name, *args])
    if script.name == "__main__.py":
        return shlex.join(["python", "-m", "poslab.bench", *args])
    if script.is_absolute() and script.is_relative_to(Path.cwd()):
        script = script.relative_to(Path.cwd())
    return shlex.join(["python", str(script), *args])


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv) == ["--memory-server"]:
        serve_memory()
        return
    options = parse_args(argv)
    check_options(options)  # before any timing: a bad setting fails in a second, not minutes in
    logging.basicConfig(level=logging.WARNING)

    def write(report: Report) -> None:
        """The page, replaced whole (written aside, then renamed): after each scheme's block
        marked unfinished, so that a run stopped part-way keeps what it measured."""
        if options.out:
            out = Path(options.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")
            part.write_text(render_markdown(report, explain=True))
            part.replace(out)

    report = run_benchmark(
        options, progress=lambda msg: print(msg, file=sys.stderr, flush=True), on_block=write
    )
    print(render_markdown(report))
    write(report)
    if options.out:
        print(f"wrote {options.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
