"""Generation speed: greedy decoding of N new tokens after a prompt of P, batch 1.

    python scripts/benchmark_generation.py            # small model, P=N=128, fp32 (+ bf16)
    python scripts/benchmark_generation.py --model tiny --prompt 8 --new-tokens 8 \\
        --rounds 1 --schemes rope --out /tmp/gen.md   # a smoke run

For every scheme (default: nope, rope, alibi, t5 and every scheme that cannot keep a key/value
cache) it times poslab's own generation loop (poslab.apps.generate.generate, what
`poslab-generate` runs) on randomly initialised weights (a fixed seed): with the key/value cache
(`model.new_cache()`) and without it (every step recomputes the whole sequence, `cache=false`),
and, beside rope, the Hugging Face peer: `transformers.LlamaForCausalLM` of the same width,
depth, heads, vocabulary and FFN width, `generate(do_sample=False, use_cache=True)`. Each
generation is timed whole (the prompt's forward and the N steps): tokens/s = N ÷ its seconds.
One untimed warm-up, then --rounds rounds, each timing every job of the scheme in turn (so that
drift of a shared machine hits them alike); the table shows the medians.

Precisions: fp32, and what `precision=auto` picks on the device where that differs (bf16 on a
CPU with bf16 instructions), as autocast, as training and evaluation run. At fp32 the cached and
recomputed generations must give the same tokens (the benchmark stops if not); at bf16 the two
round differently and random weights have flat logits, so a near-tie may flip: reported only.

The report is printed and written to --out (default outputs/benchmarks_generation.md; '' writes
nothing). A bad option is one `error: ...` line with exit code 2 before any work.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.arguments import OneLineParser, at_least, check_writable
from poslab.bench.cli import command_line, device_arg
from poslab.bench.configs import available_schemes, config_names, scheme_config
from poslab.bench.timing import Setup, Stat, make_setup
from poslab.errors import ConfigError, exit_on_config_error
from poslab.model.precision import PRECISIONS

DEFAULT_OUT = Path("outputs") / "benchmarks_generation.md"  # nothing in the tree changes
CORE_SCHEMES = ("nope", "rope", "alibi", "t5")
PEER_SCHEME = "rope"  # the scheme the Llama peer shares (rotary positions)
PEER = "HF Llama"
# GPT.cache_problem embeds 12 positions to see whether a chunked forward is exact; a learned
# table shorter than that would refuse the probe (rows past P + N change no timing)
PROBE_POSITIONS = 12


@dataclass
class GenOptions:
    model: str = "small"
    schemes: list[str] | None = None  # None: CORE_SCHEMES and every scheme without a cache
    prompt: int = 128
    new_tokens: int = 128
    rounds: int = 3
    precisions: list[str] = field(default_factory=lambda: ["32-true", "auto"])
    vocab: int = 8192  # the training benchmark's
    device: str = "cpu"
    peer: bool = True
    seed: int = 0
    out: str = str(DEFAULT_OUT)
    command: str = ""

    @property
    def length(self) -> int:
        """Every position a generation uses: the model is built for it (a learned table's rows,
        T5's `auto` distance), so nothing here extrapolates."""
        return self.prompt + self.new_tokens


@dataclass
class Row:
    """One scheme (or the peer) at one precision: tok/s with and without the cache."""

    scheme: str
    precision: str
    params: int
    cached: Stat | None = None  # None: this model keeps no cache (`problem` says why)
    recomputed: Stat | None = None
    problem: str | None = None
    agreement: str = "—"  # cached tokens against recomputed ones


@dataclass
class GenReport:
    options: GenOptions
    setups: list[Setup]
    rows: list[Row]
    machine: dict[str, str]
    seconds: float
    date: str


# -------------------------------------------------------------------- the models and the jobs


def build(options: GenOptions, scheme: str, vocab: int | None = None) -> Any:
    """poslab's model of `scheme` (a GPT) as the training benchmark builds it, seeded."""
    from poslab.model.build import build_model

    # a learned table of at least PROBE_POSITIONS rows: cache_problem probes that many
    config = scheme_config(
        options.model, scheme, options.length, max(options.length, PROBE_POSITIONS)
    )
    torch.manual_seed(options.seed)
    return build_model(config, vocab or options.vocab).eval()


def no_cache_schemes(options: GenOptions) -> list[str]:
    """The schemes of conf/pos whose model cannot keep a key/value cache (a small vocabulary:
    the answer does not depend on it, and building is then quick)."""
    found = []
    for scheme in available_schemes():
        try:
            model = build(options, scheme, vocab=64)
        except ConfigError:
            continue  # a scheme this length cannot build (hope at a few tokens): not asked for
        if model.cache_problem():
            found.append(scheme)
    return found


def build_peer(model: Any, options: GenOptions) -> nn.Module:
    """LlamaForCausalLM with poslab's width, depth, heads, vocabulary, FFN width, rope base and
    tied embeddings, randomly initialised with the seed. Its MLP is gated (three matrices to
    poslab's two) and its norms are RMSNorm: the report gives both parameter counts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        num_key_value_heads=c.n_head,
        hidden_act="gelu",
        max_position_embeddings=options.length,
        rope_parameters={"rope_type": "default", "rope_theta": float(model.pos.base)},
        attention_bias=c.bias,
        mlp_bias=c.bias,
        tie_word_embeddings=True,
        attn_implementation="sdpa",  # the kernel poslab's rope uses too
    )
    torch.manual_seed(options.seed)
    return LlamaForCausalLM(config).eval()


@dataclass
class Job:
    """One whole generation: `prepare` makes its fresh state (a cache) before the clock starts,
    `run` generates from it and returns the N new token ids (1, N)."""

    prepare: Callable[[], Any]
    run: Callable[[Any], Tensor]


def poslab_job(model: Any, prompt: Tensor, new: int, setup: Setup, cached: bool) -> Job:
    """poslab's generation loop, greedy; a fresh cache per generation, made before the clock
    starts (new_cache checks that the model allows one, which is no part of generating)."""
    from poslab.apps.generate import generate

    def run(cache: Any) -> Tensor:
        with setup.autocast():
            out = generate(model, prompt, new, 0.0, None, None, None, cache)
        return out[:, prompt.shape[1] :]

    return Job(model.new_cache if cached else lambda: None, run)


def peer_job(peer: nn.Module, prompt: Tensor, new: int, setup: Setup) -> Job:
    """HF's generate, greedy with its cache; min_new_tokens = N so that it never stops early."""
    mask = torch.ones_like(prompt)

    def run(_: Any) -> Tensor:
        with torch.inference_mode(), setup.autocast():
            out = peer.generate(
                prompt,
                attention_mask=mask,
                do_sample=False,
                use_cache=True,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=peer.config.eos_token_id,
            )
        return out[:, prompt.shape[1] :]

    return Job(lambda: None, run)


def timed(job: Job, setup: Setup) -> tuple[float, Tensor]:
    """(seconds of one generation, its new tokens)."""
    state = job.prepare()
    setup.sync()
    start = time.perf_counter()
    tokens = job.run(state)
    setup.sync()
    return time.perf_counter() - start, tokens


# ------------------------------------------------------------------------------- the run


def agreement(cached: Tensor, recomputed: Tensor, setup: Setup, scheme: str) -> str:
    """The cell saying whether both generations gave the same tokens; at fp32 they must (a
    cache that changes greedy tokens is a bug, and the benchmark stops on it)."""
    a, b = cached.flatten().tolist(), recomputed.flatten().tolist()
    if a == b:
        return "identical"
    first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    if setup.compute_dtype == torch.float32:
        raise AssertionError(
            f"{scheme} at fp32: greedy generation with the key/value cache differs from "
            f"recomputing from new token {first + 1} of {len(a)}: {a[first]} against {b[first]}"
        )
    return f"differ from token {first + 1} (not asserted at {setup.precision})"


def time_block(
    jobs: dict[str, Job], setup: Setup, options: GenOptions, say: Callable[[str], None]
) -> tuple[dict[str, Stat], dict[str, Tensor]]:
    """Every job warmed up once (its tokens kept: greedy is deterministic), then timed in
    turn in every round: tok/s per job, and each job's new tokens."""
    tokens = {name: timed(job, setup)[1] for name, job in jobs.items()}
    for name, out in tokens.items():
        if out.shape[1] != options.new_tokens:  # a peer that stopped early: a like-for-unlike
            raise AssertionError(f"{name} generated {out.shape[1]} of {options.new_tokens}")
    stats = {name: Stat() for name in jobs}
    for i in range(options.rounds):
        for name, job in jobs.items():
            seconds, _ = timed(job, setup)
            stats[name].samples.append(options.new_tokens / seconds)
        said = ", ".join(f"{n} {s.samples[-1]:,.1f}" for n, s in stats.items())
        say(f"round {i + 1}/{options.rounds} ({setup.precision}) tok/s: {said}")
    return stats, tokens


def scheme_rows(
    options: GenOptions,
    scheme: str,
    setup: Setup,
    prompt: Tensor,
    say: Callable[[str], None],
    peer_only: bool = False,
) -> list[Row]:
    """The row of `scheme` at `setup`'s precision, and the peer's beside rope (the peer alone
    with `peer_only`: rope was not asked for, but its model sizes the peer)."""
    model = build(options, scheme).to(setup.device)
    problem = model.cache_problem()
    n = options.new_tokens
    jobs: dict[str, Job] = {}
    if not peer_only:
        jobs["no cache"] = poslab_job(model, prompt, n, setup, cached=False)
        if problem is None:
            jobs["cache"] = poslab_job(model, prompt, n, setup, cached=True)
    peer = None
    if options.peer and scheme == PEER_SCHEME:
        peer = build_peer(model, options).to(setup.device)
        jobs[PEER] = peer_job(peer, prompt, n, setup)
    say(f"{scheme} ({setup.precision}): {', '.join(jobs)}")
    stats, tokens = time_block(jobs, setup, options, say)
    rows = []
    if not peer_only:
        row = Row(scheme, setup.precision, sum(p.numel() for p in model.parameters()))
        row.recomputed, row.cached, row.problem = stats["no cache"], stats.get("cache"), problem
        if problem is None:
            row.agreement = agreement(tokens["cache"], tokens["no cache"], setup, scheme)
        rows.append(row)
    if peer is not None:
        params = sum(p.numel() for p in peer.parameters())
        rows.append(Row(PEER, setup.precision, params, cached=stats[PEER]))
    return rows


def machine(setups: list[Setup]) -> dict[str, str]:
    """The training benchmark's machine lines, with transformers' version for the peer's."""
    from poslab.bench.run import machine_info

    info = machine_info(setups[0])
    try:
        from importlib.metadata import version

        peer = version("transformers")
    except Exception:
        peer = "not installed"
    info["software"] = (
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {peer}, "
        f"{platform.system()} {platform.release()}"
    )
    return info


def setups_of(options: GenOptions) -> list[Setup]:
    """One Setup per distinct precision once resolved (`auto` that picks fp32 is fp32 again)."""
    setups: dict[str, Setup] = {}
    for precision in options.precisions:
        setup = make_setup(precision, options.device)
        setups.setdefault(setup.precision, setup)
    return list(setups.values())


def run_generation(options: GenOptions, say: Callable[[str], None] = lambda _: None) -> GenReport:
    """Every scheme at every precision, one scheme's models at a time."""
    started = time.perf_counter()
    schemes = resolved_schemes(options)
    setups = setups_of(options)
    rows: list[Row] = []
    for setup in setups:
        gen = torch.Generator().manual_seed(options.seed)
        prompt = torch.randint(0, options.vocab, (1, options.prompt), generator=gen)
        prompt = prompt.to(setup.device)
        for scheme in schemes:
            rows += scheme_rows(options, scheme, setup, prompt, say)
        if options.peer and PEER_SCHEME not in schemes:  # the peer's block on its own
            rows += scheme_rows(options, PEER_SCHEME, setup, prompt, say, peer_only=True)
    return GenReport(
        options=options,
        setups=setups,
        rows=rows,
        machine=machine(setups),
        seconds=time.perf_counter() - started,
        date=dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    )


def resolved_schemes(options: GenOptions) -> list[str]:
    if options.schemes is not None:
        return list(dict.fromkeys(options.schemes))
    return list(dict.fromkeys([*CORE_SCHEMES, *no_cache_schemes(options)]))


# ---------------------------------------------------------------------------- the report


def _tok(stat: Stat | None) -> str:
    """tok/s, the median of the rounds and half their range (as the training benchmark)."""
    if stat is None or not stat.samples:
        return "—"
    spread = f" ±{stat.spread:.0%}" if len(stat.samples) > 1 else ""
    return f"{stat.median:,.1f}{spread}"


def _ms(stat: Stat | None) -> str:
    return "—" if stat is None or not stat.samples else f"{1e3 / stat.median:,.2f}"


def _x(a: Stat | None, b: Stat | None) -> str:
    if a is None or b is None or not a.samples or not b.samples:
        return "—"
    return f"{a.median / b.median:.2f}×"


def render_table(report: GenReport) -> list[str]:
    """One row per scheme and precision (the peer's after rope's)."""
    peers = {r.precision: r.cached for r in report.rows if r.scheme == PEER}
    lines = [
        "| scheme | precision | cache tok/s | cache ms/token | no cache tok/s "
        f"| no cache ms/token | cache ÷ no cache | cache = no cache (tokens) | cache ÷ {PEER} |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in report.rows:
        no_cache = r.problem is not None
        cells = [
            r.scheme if r.scheme == PEER else f"`{r.scheme}`",
            r.precision,
            "no cache" if no_cache else _tok(r.cached),
            "no cache" if no_cache else _ms(r.cached),
            _tok(r.recomputed),
            _ms(r.recomputed),
            _x(r.cached, r.recomputed),
            "n/a (no cache)" if no_cache else r.agreement,
            "—" if r.scheme == PEER else _x(r.cached, peers.get(r.precision)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_notes(report: GenReport) -> list[str]:
    """Why a scheme has no cache, and what the peer is."""
    reasons = {r.scheme: r.problem for r in report.rows if r.problem}
    lines = [f"- `{s}` keeps no key/value cache: {why}" for s, why in reasons.items()]
    sizes = {r.scheme: r.params for r in report.rows}
    if PEER in sizes:
        lines.append(
            f"- {PEER}: `transformers.LlamaForCausalLM` with rope's width, depth, heads, "
            "vocabulary, FFN width and rope base, tied embeddings, SDPA attention, random "
            f"weights; `generate(do_sample=False, use_cache=True, min_new_tokens=N)`. Its MLP "
            f"is gated (three matrices to poslab's two) and its norms RMSNorm: "
            f"{sizes[PEER] / 1e6:.2f}M parameters, poslab's rope "
            f"{sizes.get(PEER_SCHEME, 0) / 1e6:.2f}M"
        )
    return lines


def render_markdown(report: GenReport) -> str:
    o = report.options
    lines = [
        "# Generation benchmark",
        "",
        f"- **date**: {report.date}; the run took {report.seconds / 60:.1f} min",
        f"- **command**: `{o.command}`",
        *(f"- **{k}**: {v}" for k, v in report.machine.items()),
        f"- **device**: {report.setups[0].device}",
        *(f"- **precision** `{s.precision}`: {s.precision_reason}" for s in report.setups),
        f"- **workload**: model `{o.model}`, vocab {o.vocab:,}, batch 1, a prompt of "
        f"{o.prompt} random token ids, {o.new_tokens} new tokens by greedy decoding "
        f"(poslab.apps.generate.generate), random weights (seed {o.seed}); one warm-up, "
        f"then the median of {o.rounds} round(s)",
        "- **tok/s**: new tokens ÷ the seconds of the whole generation (the prompt's forward "
        "and every step); **ms/token** its inverse; ±x% is half the range of the rounds. "
        "**cache = no cache**: the greedy tokens of both, asserted equal at fp32. "
        f"**cache ÷ {PEER}**: against the Llama of the same precision, a rope model: "
        "like for like on rope's row, a reference on the others",
        "",
        *render_table(report),
    ]
    notes = render_notes(report)
    return "\n".join([*lines, *([""] + notes if notes else []), ""])


# ---------------------------------------------------------------------------- the command


def parser() -> argparse.ArgumentParser:
    defaults = GenOptions()
    p = OneLineParser(
        prog="scripts/benchmark_generation.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    positive = at_least(1)
    p.add_argument("--model", default=defaults.model, choices=config_names("model"))
    p.add_argument(
        "--schemes",
        nargs="+",
        choices=available_schemes(),
        metavar="SCHEME",
        help=f"default: {', '.join(CORE_SCHEMES)} and every scheme without a key/value cache",
    )
    p.add_argument("--prompt", type=positive, default=defaults.prompt, help="prompt tokens P")
    p.add_argument("--new-tokens", type=positive, default=defaults.new_tokens, help="N")
    p.add_argument("--rounds", type=positive, default=defaults.rounds)
    p.add_argument(
        "--precision",
        nargs="+",
        default=defaults.precisions,
        choices=PRECISIONS,
        help="each timed in turn; `auto` is what training picks on the device",
    )
    p.add_argument("--vocab", type=at_least(2), default=defaults.vocab)
    p.add_argument("--device", type=device_arg, default=defaults.device, help="cpu or cuda[:N]")
    p.add_argument("--no-peer", action="store_true", help=f"leave out {PEER}")
    p.add_argument("--seed", type=at_least(0), default=defaults.seed)
    p.add_argument("--out", default=defaults.out, help="Markdown report ('' = none)")
    return p


def parse_args(argv: list[str] | None = None) -> GenOptions:
    args = parser().parse_args(argv)
    return GenOptions(
        model=args.model,
        schemes=list(dict.fromkeys(args.schemes)) if args.schemes else None,
        prompt=args.prompt,
        new_tokens=args.new_tokens,
        rounds=args.rounds,
        precisions=list(dict.fromkeys(args.precision)),
        vocab=args.vocab,
        device=args.device,
        peer=not args.no_peer,
        seed=args.seed,
        out=args.out,
        command=command_line(argv),
    )


def check_options(options: GenOptions) -> None:
    """What would fail part-way, found before any timing: a scheme that cannot represent the
    prompt and its new tokens, a peer that is not installed, an --out that cannot be written."""
    for scheme in resolved_schemes(options):
        try:
            build(options, scheme, vocab=64).pos.check_length(options.length - 2)
        except ConfigError as err:
            raise ConfigError(f"--schemes {scheme} (model {options.model}): {err}") from None
    if options.peer:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ConfigError(
                f'{PEER} needs transformers: pip install -e ".[hf]", or pass --no-peer'
            ) from None
    if options.out:
        check_writable(options.out, "--out", folder=False)


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    options.schemes = resolved_schemes(options)  # found once (the default builds every scheme)
    check_options(options)  # before any timing: a bad setting fails in a second
    report = run_generation(options, lambda msg: print(msg, file=sys.stderr, flush=True))
    text = render_markdown(report)
    print(text)
    if options.out:
        out = Path(options.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {options.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
