"""How closely `eval.py hf=` reproduces Hugging Face's own code, measured on tiny random models
(no hub): the figures of docs/results/pretrained_parity.md.

    python scripts/pretrained_parity.py                 # writes outputs/pretrained_parity.md
    OMP_NUM_THREADS=1 python scripts/pretrained_parity.py --out docs/results/pretrained_parity.md
    python scripts/pretrained_parity.py --archs llama gpt2 --kinds yarn --factors 2 \\
        --hooks rerope --out /tmp/parity.md             # a smoke run

The tiny models of poslab/hf/tiny_hf.py (Llama, Qwen2, GPT-NeoX, GPT-NeoX rotating half of each
head, GPT-2: the ones the tests assert on) are saved with save_pretrained and loaded back with
poslab.hf.pretrained.load_pretrained, the path `eval.py hf=ID` takes, then measured:

a. scorer: poslab's per-token loss (the model's final states × its output matrix, the scorer's
   fused chunked loss) against the loss of HF's own logits, and its mean against HF's
   `labels=` loss;
b. frequencies: for pi, dynamic_ntk, yarn (ramp=reference), llama3 and longrope over s × the
   context (each --factors s), poslab's frequencies on the model (eval.py's own
   models_per_length, factor=auto) against the same weights loaded with HF's own
   `rope_parameters` of that kind and factor; and how far the kind moves the logits, so the gap
   is seen against the effect;
c. attention hook: rerope, selfextend, lminfinite and log-n with settings that change nothing
   against the untouched model; with settings that change attention, every layer's output
   against a float64 reference of the formula (poslab/hf/tiny_hf.py), the logits before the first
   position the kind changes against the model's own, and how far later ones move;
d. export: a random poslab model exported (poslab/hf/export.py: learned -> GPT-2, rope -> GPT-NeoX,
   either pairing) and loaded back through load_pretrained: logits and the scorer's per-token
   loss against poslab's own.

Every figure is a largest absolute difference (fp32 on the CPU, random token ids, fixed seeds)
beside the tolerance the tests assert, |ours − theirs| ≤ atol + rtol·|theirs| per element. They
are differences of numbers, not timings: a busy machine gives the same ones. The report (machine,
versions, command, date, one table per part) is printed and written to --out; the exit code is
1 when a figure is outside its tolerance. A bad option is one `error: ...` line, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from poslab.arguments import OneLineParser, at_least, check_writable
from poslab.errors import ConfigError, exit_on_config_error
from poslab.hf.tiny_hf import ARCHITECTURES, CONTEXT, FREQUENCY_KINDS, HOOK_LENGTH, NEUTRAL, TRICKS
from poslab.model.precision import cpu_name

if TYPE_CHECKING:  # annotations only: the functions import these where they use them
    from tokenizers import Tokenizer

    from poslab.model.gpt import GPT

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "outputs" / "pretrained_parity.md"
PARTS = ("scorer", "frequencies", "hook", "export")
HOOK_KINDS = tuple(NEUTRAL)  # rerope, selfextend, lminfinite, logn, string
# the kinds each TRICKS setting combines: it is measured when all of them are asked for
TRICK_KINDS = {
    "rerope": {"rerope"},
    "rerope_leaky": {"rerope"},
    "selfextend": {"selfextend"},
    "lminfinite": {"lminfinite"},
    "logn": {"logn"},
    "rerope_logn": {"rerope", "logn"},
    "string": {"string"},
    "string_temperature": {"string"},
}
CPU = torch.device("cpu")
# the tests' tolerances (atol, rtol): tests/hf/test_pretrained.py, hf/test_pretrained_attention.py
SCORER_TOL = (1e-5, 1e-5)
LOGIT_TOL = (2e-5, 1e-5)
REFERENCE_TOL = (2e-5, 1e-4)
EXPORT_TOL = (1e-4, 0.0)  # poslab/hf/export.py keeps an export only within 1e-4 of poslab's logits


@dataclass
class Table:
    """One part's Markdown table: a title, what it measures, its rows."""

    title: str
    text: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """How many figures were compared with a tolerance, and which were outside it."""

    checked: int = 0
    outside: list[str] = field(default_factory=list)

    def check(self, name: str, ours: Tensor, theirs: Tensor, tol: tuple[float, float]) -> str:
        """`yes` if every element of `ours` is within the tolerance of `theirs` (assert_close's
        rule), else `NO` (and counted)."""
        atol, rtol = tol
        ours, theirs = ours.double(), theirs.double()
        within = bool(((ours - theirs).abs() <= atol + rtol * theirs.abs()).all())
        self.checked += 1
        if not within:
            self.outside.append(name)
        return "yes" if within else "**NO**"


def gap(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def sci(x: float) -> str:
    """A gap: 0 or two significant digits in scientific notation."""
    return "0" if x == 0 else f"{x:.1e}"


def tol_text(tol: tuple[float, float]) -> str:
    atol, rtol = tol
    return f"{atol:g}" if rtol == 0 else f"{atol:g} + {rtol:g}·\\|ref\\|"


def random_ids(vocab: int, shape: tuple[int, int], seed: int) -> Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# -- the parts --------------------------------------------------------------------------------


def scorer_part(models: dict[str, nn.Module], tally: Tally) -> Table:
    from poslab.hf.pretrained import PretrainedLM, check_probe, rotary_state
    from poslab.model.losses import linear_token_nll

    table = Table(
        "a. The scorer against the model's own loss",
        f"Per-token loss over 3 windows of {CONTEXT} tokens (the context), poslab's scorer "
        "(final states × the output matrix, fused chunked loss) against the cross-entropy of "
        "HF's logits; the mean of the same next-token targets against HF's `labels=` loss "
        "(which shifts inside and so leaves each window's last target out). `probe`: eval.py's "
        "own load-time check (`check_probe`) passes.",
        ["model", "mean loss", "per-token gap", "within", "`labels=` mean gap", "within", "probe"],
    )
    for arch, model in models.items():
        vocab = model.config.vocab_size
        ids = random_ids(vocab, (3, CONTEXT + 1), 1)
        plain = PretrainedLM(model, arch, rotary_state(model, arch, None, CONTEXT))
        with torch.inference_mode():
            logits = model(input_ids=ids[:, :-1]).logits
            theirs = nn.functional.cross_entropy(
                logits.transpose(1, 2), ids[:, 1:], reduction="none"
            )
            mean = model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
            hidden = plain.hidden_states(ids[:, :-1])
            ours = linear_token_nll(hidden, model.get_output_embeddings().weight, ids[:, 1:])
        check_probe(plain, CPU)  # a ConfigError would stop the script: a scorer bug
        mine = ours[:, :-1].mean()
        table.rows.append(
            [
                arch,
                f"{float(theirs.mean()):.3f}",
                sci(gap(ours, theirs)),
                tally.check(f"scorer {arch}", ours, theirs, SCORER_TOL),
                sci(gap(mine, mean)),
                tally.check(f"labels= {arch}", mine, mean, SCORER_TOL),
                "passes",
            ]
        )
    table.notes.append(f"Tolerance (tests/hf/test_pretrained.py): {tol_text(SCORER_TOL)} nats.")
    return table


def native_model(folder: Path, rope: dict) -> nn.Module:
    """The saved model's weights loaded with HF's own rope_parameters `rope` (on top of its
    own: GPT-NeoX's partial_rotary_factor stays)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    config.rope_parameters = {**config.rope_parameters, **rope}
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, attn_implementation="sdpa")
    return model.eval()


def refusal(call: Callable[[], object]) -> str:
    """The one line eval.py prints for `call`'s ConfigError."""
    try:
        call()
    except ConfigError as err:
        return str(err)
    raise RuntimeError("expected a ConfigError")  # a model that should be refused was not


def frequencies_part(
    models: dict[str, nn.Module],
    folders: dict[str, Path],
    kinds: list[str],
    factors: list[int],
    tally: Tally,
) -> Table:
    from poslab.hf.pretrained import models_per_length, rotary_state
    from poslab.hf.tiny_hf import frequency_kind

    table = _frequencies_table(factors)
    for arch, model in models.items():
        if not _rotary(model):  # GPT-2: eval.py's one line, as a user would see it
            options = frequency_kind(kinds[0], 2.0, 4)[0]
            line = refusal(
                lambda m=model, a=arch, o=options: models_per_length(
                    m, a, o, [2 * CONTEXT], CONTEXT, CPU
                )
            )
            table.notes.append(f"`{arch}` (no rotary): one line, `{line}`.")
            continue
        pairs = rotary_state(model, arch, None, CONTEXT).inv_freq[0].shape[-1]
        for kind in kinds:
            table.rows.append(
                _frequency_row(model, arch, folders[arch], kind, factors, pairs, tally)
            )
    table.notes.append(
        f"Tolerance (tests/hf/test_pretrained.py): {tol_text(LOGIT_TOL)} per logit; every gap "
        "above is within it unless marked **NO**."
    )
    if "neox_partial" in models and {"dynamic_ntk", "llama3"} <= set(kinds):
        table.notes.append(
            "`neox_partial` rotates 4 dims per head (2 pairs, θ = 1 and 0.01): there dynamic_ntk "
            "(at T = sL, base·s^(R/(R−2)) = base·s²) and llama3 both keep the fast pair and "
            "divide the slow one by s, so their rows move the logits alike."
        )
    return table


def _frequencies_table(factors: list[int]) -> Table:
    """Part b's empty table: its text, and two columns per factor."""
    header = ["model", "kind"]
    for s in factors:
        header += [f"{s}×: gap", f"{s}×: kind moves logits by"]
    return Table(
        "b. Frequency kinds against Hugging Face's own `rope_parameters`",
        "Logits over 2 windows of s × the context (s × 32 tokens): poslab's frequencies on the "
        "loaded model, through eval.py's own `models_per_length` with its default "
        "`eval.rope_scaling.factor=auto` (s; dynamic_ntk: 1, as it reads the length itself), "
        "against the same saved weights loaded with HF's `rope_parameters` of that kind and "
        "factor (pi: `linear`, dynamic_ntk: `dynamic`, yarn with "
        "`eval.rope_scaling.ramp=reference`: `yarn`, llama3: `llama3`, longrope: `longrope` with "
        "made-up per-pair factors 1, 1.5, 2, …); `gap`: the largest logit difference; `moves "
        "logits by`: the largest difference to the unscaled model at the same length (the "
        "effect the gap is to be read against). `ntk` (static NTK-aware) has no HF "
        "`rope_type` to compare with.",
        header,
    )


def _frequency_row(
    model: nn.Module,
    arch: str,
    folder: Path,
    kind: str,
    factors: list[int],
    pairs: int,
    tally: Tally,
) -> list[str]:
    """One model's row of part b for one frequency kind: at each factor, the gap to HF's own
    `rope_parameters` (checked against the tolerance) and how far the kind moves the logits."""
    from poslab.hf.pretrained import models_per_length
    from poslab.hf.tiny_hf import frequency_kind
    from poslab.positions.rope_scaling import resolve_factor

    row = [arch, kind]
    for s in factors:
        length = s * CONTEXT
        # eval.py's default factor=auto: s, except dynamic_ntk's 1 (it reads the length)
        factor = resolve_factor(kind, "auto", length, CONTEXT)
        ours, theirs = frequency_kind(kind, factor, pairs)
        ours["factor"] = "auto"
        ids = random_ids(model.config.vocab_size, (2, length), 2)
        scaled = models_per_length(model, arch, ours, [length], CONTEXT, CPU)[length]
        plain = models_per_length(model, arch, None, [length], CONTEXT, CPU)[length]
        native = native_model(folder, theirs)
        with torch.inference_mode():
            expected = native(input_ids=ids).logits
            got, unscaled = scaled(ids), plain(ids)
        within = tally.check(f"{kind} {s}× {arch}", got, expected, LOGIT_TOL)
        mark = "" if within == "yes" else f" ({within})"
        row += [sci(gap(got, expected)) + mark, f"{gap(got, unscaled):.3g}"]
    return row


def _rotary(model: nn.Module) -> bool:
    from poslab.hf.pretrained import rotary_modules

    return bool(rotary_modules(model))


def hook_parts(models: dict[str, nn.Module], hooks: list[str], tally: Tally) -> list[Table]:
    tricks = [t for t, needs in TRICK_KINDS.items() if needs <= set(hooks)]
    neutral, formula = _hook_tables(hooks)
    refused: list[str] = []
    for arch, model in models.items():
        if not _rotary(model):
            refused.append(
                f"`{arch}` (no rotary): one line, `{_hook_refusal(model, arch, hooks)}`."
            )
            continue
        neutral.rows.append(_neutral_row(model, arch, hooks, tally))
        formula.rows += _formula_rows(model, arch, tricks, tally)
    neutral.notes.append(
        f"Tolerance (tests/hf/test_pretrained_attention.py): {tol_text(LOGIT_TOL)} per logit; "
        "every gap above is within it unless marked **NO**."
    )
    neutral.notes += refused
    formula.notes.append(
        f"Tolerances (tests/hf/test_pretrained_attention.py): {tol_text(REFERENCE_TOL)} per layer "
        f"output against the reference, {tol_text(LOGIT_TOL)} per logit before p."
    )
    return [neutral, formula]


def _hooked(model: nn.Module, arch: str, options: dict) -> nn.Module:
    """The model with poslab's attention hook of `options` at the tiny models' context."""
    from poslab.hf.pretrained import hooked_model
    from poslab.positions.rope_scaling import RopeScaling

    return hooked_model(model, arch, RopeScaling(**options, train_length=CONTEXT))


def _hook_tables(hooks: list[str]) -> tuple[Table, Table]:
    """Parts c1 (neutral settings, a column per hook kind) and c2 (against the formula), empty."""
    neutral = Table(
        "c1. The attention hook with settings that change nothing",
        "Logits of the hooked model (the model's rotary module handing out the identity, "
        "poslab's `Rotary` and blockwise kernel in its attention) against the untouched model "
        "(its own sdpa attention): rerope and selfextend with a window over the whole probe "
        f"({HOOK_LENGTH} tokens), lminfinite with its window at the context and no global "
        f"tokens, log-n alone (both neutral up to the context: {CONTEXT} tokens).",
        ["model", *hooks],
    )
    formula = Table(
        "c2. The attention hook against a float64 reference of each formula",
        f"Settings that change attention within {HOOK_LENGTH} tokens (window w = 8, "
        "Self-Extend's group 4, LM-Infinite's 2 global tokens, leaky ReRoPE's k = 2): `vs "
        "reference`: every layer's attention output against the formula written in float64 "
        "from the layer's weights with one relative distance per query-key pair "
        "(poslab/hf/tiny_hf.py; poslab merges two score matrices instead); `before position p`: "
        "the logits up to the first position the kind changes, against the model's own; "
        "`moves later logits by`: the largest change at or after p.",
        [
            "setting",
            "model",
            "vs reference",
            "within",
            "before position p",
            "within",
            "moves later logits by",
        ],
    )
    return neutral, formula


def _hook_refusal(model: nn.Module, arch: str, hooks: list[str]) -> str:
    """The one line eval.py prints for a hook on a model without rotary positions."""
    from poslab.hf.pretrained import models_per_length

    kind = next((k for k in hooks if k != "logn"), "none")  # logn alone: none + logn
    options = {"kind": kind, "logn": kind == "none"}
    return refusal(
        lambda m=model, a=arch, o=options: models_per_length(m, a, o, [CONTEXT], CONTEXT, CPU)
    )


def _neutral_row(model: nn.Module, arch: str, hooks: list[str], tally: Tally) -> list[str]:
    """One model's row of part c1: each hook kind's neutral setting against the untouched model."""
    row = [arch]
    for kind in hooks:
        options, length = NEUTRAL[kind]
        ids = random_ids(model.config.vocab_size, (2, length), 0)
        with torch.inference_mode():
            own = model(input_ids=ids).logits
            got = _hooked(model, arch, options)(ids)
        within = tally.check(f"neutral {kind} {arch}", got, own, LOGIT_TOL)
        row.append(sci(gap(got, own)) + ("" if within == "yes" else f" ({within})"))
    return row


def _formula_rows(model: nn.Module, arch: str, tricks: list[str], tally: Tally) -> list[list[str]]:
    """One model's rows of part c2, a row per setting: every layer's attention output against
    the float64 formula, the logits before the first changed position, and the change after."""
    from poslab.hf.pretrained import rotary_state
    from poslab.hf.tiny_hf import recorded_attention, reference_attention

    rows = []
    theta = rotary_state(model, arch, None, CONTEXT).inv_freq[0]
    ids = random_ids(model.config.vocab_size, (2, HOOK_LENGTH), 0)
    for trick in tricks:
        options, p = TRICKS[trick]  # p: the first position whose logits change
        wrapper = _hooked(model, arch, options)
        records = recorded_attention(model, wrapper, ids)
        with torch.no_grad():  # every layer's output, and the formula's from its input
            ours = torch.cat([got.double().flatten() for _, _, got in records])
            ref = torch.cat(
                [reference_attention(trick, layer, theta, x).flatten() for layer, x, _ in records]
            )
        with torch.inference_mode():
            own = model(input_ids=ids).logits
            got = wrapper(ids)
        rows.append(
            [
                trick,
                arch,
                sci(gap(ours, ref)),
                tally.check(f"reference {trick} {arch}", ours, ref, REFERENCE_TOL),
                f"{sci(gap(got[:, :p], own[:, :p]))} (p = {p})",
                tally.check(f"before p {trick} {arch}", got[:, :p], own[:, :p], LOGIT_TOL),
                f"{gap(got[:, p:], own[:, p:]):.3g}",
            ]
        )
    return rows


def export_part(tally: Tally, work: Path) -> Table:
    from tokenizers import Tokenizer, models

    table = Table(
        "d. A poslab model exported as a Hugging Face model",
        "A random poslab model (2 layers, d = 32, 4 heads, vocabulary 64, weights moved off "
        "their init) exported with poslab/hf/export.py (what scripts/export_hf.py runs on a run's "
        "checkpoint) and loaded back through `load_pretrained`, as `eval.py hf=FOLDER` loads "
        "it: the largest logit difference to poslab's own model over 2 windows at the trained "
        "length L (and at 4 L where the scheme has no table), and the largest per-token loss "
        "difference of eval.py's scorer on the export to poslab's own model.",
        ["poslab model", "exported as", "L", "logit gap at L", "at 4 L", "within", "loss gap"],
    )
    vocab, length = 64, 24
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    cases = [
        ("learned", "learned", {"max_positions": length}, True),
        ("rope, half pairing", "rope", {"pairing": "half", "base": 500.0}, True),
        ("rope, half pairing, half the dims", "rope", {"pairing": "half", "fraction": 0.5}, False),
        ("rope, interleaved pairing", "rope", {"pairing": "interleaved", "fraction": 0.5}, False),
    ]
    for index, (label, scheme, options, bias) in enumerate(cases):
        model = _random_poslab_model(index, scheme, options, bias, vocab)
        table.rows.append(
            _export_row(model, label, scheme, work / f"export{index}", tokenizer, length, tally)
        )
    table.notes.append(
        f"Tolerance: {tol_text(EXPORT_TOL)} per logit and per-token loss (scripts/export_hf.py "
        "keeps an export only within it; tests/hf/test_export.py)."
    )
    return table


def _random_poslab_model(index: int, scheme: str, options: dict, bias: bool, vocab: int) -> GPT:
    """Export case `index`'s poslab model (seeded by the index), its weights moved off the
    init so that a swapped or zeroed tensor in the export would show."""
    from poslab.model.gpt import GPT, GPTConfig
    from poslab.positions.learned import LearnedPositions
    from poslab.positions.rope import Rotary

    torch.manual_seed(index)
    config = GPTConfig(vocab_size=vocab, n_layer=2, n_head=4, d_model=32, bias=bias)
    pos_class = LearnedPositions if scheme == "learned" else Rotary
    model = GPT(config, pos_class(32, 4, **options)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


def _export_row(
    model: GPT,
    label: str,
    scheme: str,
    folder: Path,
    tokenizer: Tokenizer,
    length: int,
    tally: Tally,
) -> list[str]:
    """Part d's row of one model: exported to `folder`, loaded back as eval.py loads it, and
    its logits (at L, and 4 L for rope) and scorer loss compared with poslab's own."""
    from poslab.hf.export import export_hf
    from poslab.hf.pretrained import PretrainedLM, load_pretrained, rotary_state
    from poslab.model.losses import linear_token_nll

    vocab = model.config.vocab_size
    export_hf(model, {"pos_name": scheme, "data": {"seq_len": length}}, tokenizer, folder)
    hf, _ = load_pretrained(str(folder), CPU, "32-true")
    scored = PretrainedLM(hf, label, rotary_state(hf, label, None, length))
    row = [label, type(hf).__name__, str(length)]
    logit_gaps, loss_gap, all_ours, all_theirs = [], 0.0, [], []
    for n in (length, 4 * length) if scheme == "rope" else (length,):
        ids = random_ids(vocab, (2, n + 1), 0)
        with torch.inference_mode():
            ours = model(ids[:, :-1])
            theirs = hf(input_ids=ids[:, :-1]).logits
            own_loss = nn.functional.cross_entropy(
                ours.transpose(1, 2), ids[:, 1:], reduction="none"
            )
            hidden = scored.hidden_states(ids[:, :-1])
            loss = linear_token_nll(hidden, hf.get_output_embeddings().weight, ids[:, 1:])
        logit_gaps.append(sci(gap(ours, theirs)))
        all_ours += [ours.flatten(), loss.flatten()]
        all_theirs += [theirs.flatten(), own_loss.flatten()]
        loss_gap = max(loss_gap, gap(loss, own_loss))
    row += [logit_gaps[0], logit_gaps[1] if len(logit_gaps) > 1 else "— (a table of L rows)"]
    row.append(
        tally.check(f"export {label}", torch.cat(all_ours), torch.cat(all_theirs), EXPORT_TOL)
    )
    row.append(sci(loss_gap))
    return row


# -- the report -------------------------------------------------------------------------------


def machine() -> list[str]:
    cpu = cpu_name()
    import tokenizers
    import transformers

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"- **machine**: {cpu}, {os.cpu_count()} logical CPUs, torch intra-op threads "
        f"{torch.get_num_threads()}; {platform.system()} {platform.release()}",
        f"- **load**: 1-minute load average {load:.1f} at the start: the machine was shared "
        "with other jobs. Timing is not what this measures: every figure is a difference of "
        "numbers computed in fp32 from fixed seeds, the same on an idle machine.",
        f"- **software**: Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
    ]


def render(tables: list[Table], header: list[str], tally: Tally) -> str:
    lines = ["# Pretrained models: poslab's path against Hugging Face's own code", ""]
    lines += header
    verdict = (
        f"all {tally.checked} compared figures are within the tests' tolerances"
        if not tally.outside
        else f"{len(tally.outside)} of {tally.checked} figures outside their tolerance: "
        + ", ".join(tally.outside)
    )
    lines += [f"- **result**: {verdict}", ""]
    for table in tables:
        lines += [f"## {table.title}", "", table.text, ""]
        if table.rows:
            lines.append("| " + " | ".join(table.header) + " |")
            lines.append("|" + "|".join("---" for _ in table.header) + "|")
            lines += ["| " + " | ".join(row) + " |" for row in table.rows]
            lines.append("")
        lines += [*table.notes, ""] if table.notes else []
    return "\n".join(lines).rstrip() + "\n"


def command_line(argv: list[str] | None) -> str:
    """The command as typed from the repository root, with OMP_NUM_THREADS if it was set."""
    args = sys.argv[1:] if argv is None else argv
    threads = os.environ.get("OMP_NUM_THREADS")
    prefix = [f"OMP_NUM_THREADS={threads}"] if threads else []
    return " ".join([*prefix, shlex.join(["python", "scripts/pretrained_parity.py", *args])])


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="scripts/pretrained_parity.py",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART")
    p.add_argument("--archs", nargs="+", choices=ARCHITECTURES, default=list(ARCHITECTURES))
    p.add_argument("--kinds", nargs="+", choices=FREQUENCY_KINDS, default=list(FREQUENCY_KINDS))
    p.add_argument(
        "--factors",
        nargs="+",
        type=at_least(2),
        default=[2, 4, 8],
        metavar="S",
        help="frequency kinds at s × the context (whole numbers ≥ 2)",
    )
    p.add_argument("--hooks", nargs="+", choices=HOOK_KINDS, default=list(HOOK_KINDS))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown report")
    return p


def unique(values: Iterable) -> list:
    return list(dict.fromkeys(values))


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    check_writable(args.out, "--out", folder=False)
    import transformers

    from poslab.hf.pretrained import load_pretrained
    from poslab.hf.tiny_hf import save_tiny, tiny_text, tokenizer_for

    transformers.logging.set_verbosity_error()  # saving reports and progress bars: not figures
    transformers.logging.disable_progress_bar()
    parts, archs = unique(args.parts), unique(args.archs)
    started, date = time.perf_counter(), datetime.now().astimezone()
    header = [
        f"- **date**: {date:%Y-%m-%d %H:%M %Z}",
        f"- **command**: `{command_line(argv)}`",
        *machine(),
        f"- **models**: poslab/hf/tiny_hf.py's {', '.join(f'`{a}`' for a in archs)}: 2 layers, "
        f"hidden size 32, 4 heads (Llama and Qwen2: 2 key/value heads), context {CONTEXT}, "
        "vocabulary 300 (a byte-level BPE), initializer_range 0.2 (10× HF's default, so that "
        "attention is far from uniform and positions show in the logits); each saved with "
        "save_pretrained and loaded back with poslab.hf.pretrained.load_pretrained (fp32, sdpa, "
        "CPU), the path of `eval.py hf=ID`",
    ]
    tally, tables = Tally(), []
    with tempfile.TemporaryDirectory(prefix="poslab-parity-") as tmp:
        work = Path(tmp)
        tokenizer = tokenizer_for(tiny_text())
        folders = {a: save_tiny(a, work / a, tokenizer) for a in archs}
        models = {a: load_pretrained(str(f), CPU, "32-true")[0] for a, f in folders.items()}
        if "scorer" in parts:
            tables.append(scorer_part(models, tally))
        if "frequencies" in parts:
            kinds, factors = unique(args.kinds), unique(args.factors)
            tables.append(frequencies_part(models, folders, kinds, factors, tally))
        if "hook" in parts:
            tables += hook_parts(models, unique(args.hooks), tally)
        if "export" in parts:
            tables.append(export_part(tally, work))
    header.append(f"- **took**: {time.perf_counter() - started:.0f} s")
    report = render(tables, header, tally)
    print(report, end="", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out}", flush=True)
    if tally.outside:
        print(f"{len(tally.outside)} figures outside their tolerance", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
