"""The bad-input tables of train.py, eval.py and the scripts without Hydra (benchmark.py,
compare.py, analysis.py, pretrained_parity.py): each case is one command line and the text its
one `error: ...` line must hold. The fast suite runs every case in-process through the entry
function the command calls (tests/apps/, tests/test_scripts.py); tests/e2e/test_bad_inputs_cli.py
runs the same tables as real processes (slow).

Every case must keep the bad-input contract: exit code 2, exactly one stderr line `error: ...`
saying what to change, no traceback, and nothing left at the case's output path."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from conftest import REPO, TINY, contract_problems

SCRIPTS = REPO / "scripts"


@dataclass(frozen=True)
class Case:
    """One command: `app` (train, eval, benchmark.py, compare.py, analysis.py), its arguments
    (templates: {names} are filled per run, {out} is the case's own output path), the texts the
    error line must hold and one it must not."""

    app: str
    args: tuple[str, ...]
    expected: tuple[str, ...]
    absent: str | None = None

    def argv(self, values: dict[str, str], out: Path) -> list[str]:
        return [a.format(**values, out=out) for a in self.args]

    @property
    def id(self) -> str:
        base = {
            "train": len(TRAIN_BASE),
            "benchmark.py": len(QUICK_BENCH),
            "benchmark_generation.py": len(QUICK_GENERATION),
        }.get(self.app, 0)
        shown = [a for a in self.args[base:] if not a.endswith("={out}")]
        return f"{self.app} {' '.join(shown)}"[:90]


# what every training case runs with, before its own overrides (the case's run folder last)
TRAIN_BASE = ("data.path={corpus}", *TINY, "logger=csv")


def train_case(*overrides: str, expected: str | tuple[str, ...], absent: str | None = None) -> Case:
    expected = (expected,) if isinstance(expected, str) else expected
    return Case("train", (*TRAIN_BASE, *overrides, "hydra.run.dir={out}"), expected, absent)


def eval_case(
    *args: str, expected: str | tuple[str, ...], absent: str | None = None, wandb: bool = True
) -> Case:
    expected = (expected,) if isinstance(expected, str) else expected
    tail = ("out_dir={out}",) if wandb else ("out_dir={out}", "wandb=false")
    return Case("eval", (*args, *tail), expected, absent)


# {corpus}, {binary}, {latin1}, {blank} ({bad_corpora}), {short}, {vdir}, {vlink}, {missing},
# {mrope}, {cut} ({bad_data}, {mrope_runs}), {learned}, {rope} (trained_runs), {task} (a passkey
# run) and {file} (a text file that is no checkpoint) are filled in per run
TRAIN_BAD = [
    train_case("seed=abc", expected="seed=abc must be an integer"),
    train_case("seed=1.5", expected="seed=1.5"),
    train_case("optim.lr=nan", expected="optim.lr=nan must be a finite number > 0"),
    train_case("optim.lr=-1", expected="optim.lr=-1"),
    train_case("optim.warmup_steps=-1", expected="optim.warmup_steps=-1"),
    train_case("optim.betas=[0.9]", expected="optim.betas=[0.9]"),
    train_case("pos.base=-1", expected="pos.base=-1"),
    train_case("pos.base=0", expected="pos.base=0"),
    train_case("pos.bsae=500", expected="pos.bsae: there is no such key"),
    train_case("pos=foo", expected="pos=foo is not an option; choose one of: alibi"),
    train_case("pos=learned", "eval.unsupported=error", expected="pos.max_positions"),
    train_case("pos=t5", "pos.num_buckets=0", expected="pos.num_buckets=0"),
    train_case("eval.stride=-4", expected="eval.stride=-4"),
    train_case("eval.stride=0", expected="eval.stride=0"),
    train_case("eval.bucket_size=-1", expected="eval.bucket_size=-1"),
    train_case("eval.position_offset=-20", expected="eval.position_offset=-20"),
    train_case("eval.max_tokens=-5", expected="eval.max_tokens=-5"),
    train_case("eval.lengths=[0]", expected="eval.lengths=[0]"),
    train_case("eval.factors=[0.001]", expected="eval.factors=[0.001]"),
    train_case("eval.modes=[foo]", expected="eval.modes=[foo]"),
    train_case("+eval.pos_overrides.max_positions=8", expected="eval.pos_overrides.max_positions"),
    train_case("pos=learned", "+eval.pos_overrides.max_positions=8", expected="eval.pos_overrides"),
    # a documented mapping option without its + was "no such key" (#43): it exists
    train_case(
        "eval.pos_overrides={{beyond_table:clamp}}",
        expected="eval.pos_overrides takes a mapping of new keys; write it with a leading +",
    ),
    train_case("trainer.max_steps=0", expected="trainer.max_steps=0"),
    train_case("trainer.precision=bf17", expected="trainer.precision=bf17"),
    # Lightning trained bf16-mixed with a warning while the log and config said 16-mixed (#43)
    train_case(
        "trainer.precision=16-mixed",
        "trainer.accelerator=cpu",
        expected="trainer.precision=16-mixed (fp16 autocast) trains on CUDA GPUs only",
    ),
    # trained 0 steps, then failed in the evaluation with eval.py's advice (#43)
    train_case("+trainer.limit_train_batches=0", expected="trainer.limit_train_batches=0 must be"),
    # options of a scheme no layer runs were ignored (#43)
    train_case(
        "pos=schedule",
        "+pos.options={{alibi:{{learnable_slopes:true}}}}",
        expected="pos.options.alibi: alibi is in no layer of pos.layers=[rope,nope]",
    ),
    # a single text file as data.path was told to "add valid.txt" (#43)
    train_case(
        "data.path={corpus}/train.txt",
        expected="one text file is read as the train split only; set data.valid_fraction",
    ),
    # Hydra's parser error had no hint to quote the value (#43)
    train_case(
        "data.path=/tmp/my corpus!",
        expected="cannot read the override 'data.path=/tmp/my corpus!': quote a value with",
    ),
    # keys the schema did not cover (#43): accepted without a word
    train_case("model.bias=maybe", expected="model.bias=maybe must be true or false"),
    train_case("model.scale_embeddings=2", expected="model.scale_embeddings=2 must be true or"),
    # model options of #45: a bad value, and sinks on a kernel without a softmax over keys
    train_case("model.gate=both", expected="model.gate=both is not one of null, headwise"),
    train_case(
        "model.sinks=true", "attention=linear", expected="model.sinks=true: attention=linear"
    ),
    train_case("data.word_level=maybe", expected="data.word_level=maybe must be true or false"),
    # found by the schema's coverage test (tests/run/test_validate.py): a traceback, or
    # accepted and ignored
    train_case("trainer.num_sanity_val_steps=abc", expected="trainer.num_sanity_val_steps=abc"),
    train_case("trainer.enable_model_summary=maybe", expected="must be true or false"),
    train_case("trainer.enable_progress_bar=maybe", expected="must be auto, true or false"),
    train_case("data.name=[1]", expected="data.name=[1] must be a text"),
    # callbacks composed from conf/callbacks/ (#44): a bad one before any work
    train_case("callbacks.console.every=[1]", expected="ConsoleLine"),
    train_case("+callbacks.x=5", expected="callbacks.x must be a mapping with a _target_"),
    train_case(
        "+callbacks.x={{_target_:poslab.data.tokens.TokenizedSplit}}",
        expected="cannot build poslab.data.tokens.TokenizedSplit",
    ),
    train_case(
        "+callbacks.x={{_target_:collections.OrderedDict}}",
        expected="callbacks.x: collections.OrderedDict is not a lightning Callback",
    ),
    train_case("data.seq_len=0", expected="data.seq_len=0"),
    train_case("data.batch_size=0", expected="data.batch_size=0"),
    train_case("model.d_model=33", expected="model.d_model=33 is not divisible by model.n_head"),
    train_case("model.dropout=1.5", expected="model.dropout=1.5"),
    train_case("resume=/no/such/run", expected="resume=/no/such/run does not exist"),
    # extend=RUN (poslab/run/extend.py; every bad parent: tests/run/test_extend.py)
    train_case("extend=/no/such/run", expected="extend=/no/such/run does not exist"),
    train_case("extend={file}", expected="is a file, not a run folder"),
    # (TRAIN_BASE names data.path, which a passkey parent's data does not have)
    train_case("extend={task}", expected="data.path is not an option of the parent's data"),
    # the parent's config says its vocabulary: refused before the corpus is tokenized (#60)
    train_case(
        "extend={rope}",
        "data.vocab_size=1024",
        expected="extend: data.vocab_size=1024, but the parent trained with data.vocab_size=",
    ),
    train_case("+pos.scaling.kind=pi", expected="pos.scaling is a train-time RoPE extension"),
    train_case("data.path=/no/such/corpus", expected="data.path=/no/such/corpus does not exist"),
    train_case("data.path={binary}", expected="train.txt"),
    train_case("data.path={latin1}", expected="valid.txt"),
    train_case("data.path={blank}", expected="valid.txt"),
    train_case("pos=alibi", "eval.rope_scaling.kind=pi", expected="act on rotary schemes"),
    # a scheme that reads no positions: said first, not "no such key … use +" (#60)
    train_case(
        "pos=path_attn",
        "pos.randomize_max=64",
        expected="pos.randomize_max: PaTH reads no positions",
        absent="no such key",
    ),
    train_case("eval.gain_threshold=5", expected="eval.gain_threshold=5 is read only by context"),
    train_case("pos=rope", "pos.theta_param=exp", expected="pos.theta_param='exp'"),
    train_case("pos=alibi", "pos.position_dtype=fp16", expected="pos.position_dtype='fp16'"),
    # found by the second reliability pass: each was a traceback, or failed after training
    train_case("seed=-1", expected="seed=-1 must be an integer ≥ 0"),
    train_case("logger=wandb", "logger.init_timeout=abc", expected="logger.init_timeout=abc"),
    train_case(
        "+logger.flush_logs_every_n_steps=abc", expected="logger.flush_logs_every_n_steps=abc"
    ),
    train_case("logger=wandb", "+logger.bogus=1", expected="logger.bogus: WandbLogger has no such"),
    train_case("+trainer.bogus=1", expected="trainer.bogus: lightning.Trainer has no such option"),
    train_case("eval.precision=64-true", expected="eval.precision=64-true is not one of"),
    train_case("eval.precision=bf16-true", expected="eval.precision=bf16-true is not one of"),
    train_case("eval.precision=32", expected="eval.precision=32 is not one of"),
    train_case("trainer.precision=64-true", expected="trainer.precision=64-true is not one of"),
    *(
        [train_case("eval.device=cuda", expected="eval.device=cuda but no CUDA device is visible")]
        if not torch.cuda.is_available()
        else []
    ),
    # bad input said as it is: a short split, a split file that is a folder or a broken symlink,
    # an eval-time scaling a multi-axis scheme refuses (in the user's keys), options out of range
    train_case(
        "data.path={short}",
        "data.seq_len=512",
        expected="the validation split ({short}/valid.txt) has 8 tokens, fewer than the "
        "data.seq_len=512",
    ),
    train_case(
        "data.path={vdir}",
        expected="{vdir}/valid.txt is a directory, not a text file",
        absent="add valid.txt",
    ),
    train_case(
        "data.path={vlink}",
        expected="{vlink}/valid.txt is a broken symlink to {missing}",
        absent="add valid.txt",
    ),
    train_case(
        "pos=mrope",
        "eval.rope_scaling.kind=pi",
        expected="eval.rope_scaling.kind=pi:",
        absent="pos.scaling",
    ),
    train_case("attention.full_bias_mib=-1", expected="attention.full_bias_mib=-1 must be"),
    train_case("pos=sandwich", "pos.dim=7", expected="pos.dim=7 must be even"),
    # the methods of 2024-25: a window that hides nothing, schedules longer than the model,
    # a scaling kind on a scheme without rotary, a kernel that cannot serve a scheme
    train_case("attention.window=100000", expected="hides no key; choose a window below"),
    train_case("attention.window=[4,4,4]", expected="3 entries for a model of 2 layers"),
    train_case("attention.window=0", expected="attention.window=0 must be an integer"),
    train_case("pos=schedule", "pos.layers=[rope,nope,rope]", expected="pos.layers has 3 entries"),
    train_case("pos=schedule", "pos.layers=[rope,learned]", expected="token embeddings"),
    train_case(
        "pos=fox", "eval.rope_scaling.kind=llama3", expected="act on rotary schemes", absent="pos."
    ),
    train_case("pos=cope", "attention=stick_breaking", expected="cannot serve pos=CoPE"),
    train_case("pos=learned", "pos.combine=sum", expected="pos.combine='sum'; choose one of"),
]

EVAL_BAD = [
    eval_case(expected="pass exactly one of ckpt=PATH"),
    eval_case("ckpt=/no/such.ckpt", expected="/no/such.ckpt does not exist"),
    eval_case("ckpt={file}", expected="train.txt as a checkpoint"),
    eval_case("run={learned}", "eval.lengths=[32,64]", expected="pos.max_positions"),
    eval_case("run={learned}", "eval.position_offset=-20", expected="eval.position_offset=-20"),
    eval_case(
        "run={learned}", "+eval.pos_overrides.max_positions=8", expected="eval.pos_overrides"
    ),
    eval_case("run={rope}", "data_path={binary}", expected="train.txt"),
    eval_case("run={rope}", "eval.modes=[foo]", expected="eval.modes=[foo]"),
    eval_case("run={rope}", "eval.rope_scaling.kind=foo", expected="eval.rope_scaling.kind='foo'"),
    # STRING's W ≤ S, with S by its rule at the run's L = 16 (not at the placeholder L of the
    # first option check, which once said shift=1)
    eval_case(
        "run={rope}",
        "eval.rope_scaling.kind=string",
        "eval.rope_scaling.local=1000",
        expected="local=1000 must be at most shift=5 (int(0.33 · L) at L = 16)",
    ),
    # options that would change nothing (#60): another kind's option, a factor string ignores,
    # a gain threshold without context use
    eval_case(
        "run={rope}",
        "eval.rope_scaling.kind=yarn",
        "eval.rope_scaling.shift=5",
        expected="eval.rope_scaling.shift=5 is an option of string, which kind=yarn does not read",
    ),
    eval_case(
        "run={rope}",
        "eval.rope_scaling.kind=string",
        "eval.rope_scaling.factor=4",
        expected="eval.rope_scaling.factor=4: kind=string reads no factor",
    ),
    eval_case(
        "run={rope}",
        "eval.gain_threshold=5",
        expected="eval.gain_threshold=5 is read only by context use; set eval.short_context",
    ),
    eval_case("run={rope}", "eval.short_context=0", expected="eval.short_context=0 must be an"),
    # a context-use setting that would measure no row (#45)
    eval_case(
        "run={rope}",
        "eval.short_context=1000",
        expected="eval.short_context=1000 is not below any evaluation length (16, 32, 64",
    ),
    eval_case(
        "run={rope}",
        "eval.short_context=8",
        "eval.modes=[sliding]",
        expected="eval.short_context=8 measures non-overlapping rows",
    ),
    eval_case("run={task}", "eval.short_context=8", expected="eval.short_context=8:"),
    eval_case(
        "run={rope}",
        "eval.rope_scaling.kind=pi",
        "eval.rope_scaling.factor=0.5",
        expected="eval.rope_scaling.factor=0.5",
    ),
    eval_case(
        "run={rope}", "eval.rope_scaling.beta_fast=-1", expected="eval.rope_scaling.beta_fast=-1"
    ),
    eval_case("run={learned}", "eval.logn_scaling=true", expected="act on rotary schemes"),
    # a checkpoint path that is a folder or a damaged file; a multi-axis scheme's scaling
    eval_case(
        "ckpt={mrope}",
        expected="{mrope} is a directory; pass a .ckpt file",
        absent="does not exist",
    ),
    eval_case(
        "ckpt={cut}/checkpoints/last.ckpt",
        expected=(
            "{cut}/checkpoints/last.ckpt is corrupt or incomplete",
            # what to do: use the intact best.ckpt beside it
            "delete it and pass the checkpoint beside it instead: {cut}/checkpoints/best.ckpt",
        ),
    ),
    eval_case(
        "run={mrope}",
        "eval.rope_scaling.kind=pi",
        expected="eval.rope_scaling.kind=pi:",
        absent="pos.scaling",
    ),
    # eval.py's top-level options, and a task checkpoint's corpus options
    eval_case(
        "run={rope}", "wandb=maybe", expected="wandb=maybe must be true or false", wandb=False
    ),
    eval_case("run={rope}", "wandb=null", expected="wandb=null must be true or false", wandb=False),
    eval_case("run={rope}", "out_dir=true", expected="out_dir=true is not a path", wandb=False),
    eval_case(
        "run=7",
        expected="run=7 is a number, not a path; for a path named 7 write run=./7",
        wandb=False,
    ),
    eval_case("ckpt=[a,b]", expected="ckpt=[a, b] is not a path", wandb=False),
    eval_case(
        "run={rope}", "data_path=false", expected="data_path=false is not a path", wandb=False
    ),
    eval_case(
        "run={rope},{{x: 1}}",
        expected="run={{x: 1}} is not a path",  # each -m value
        wandb=False,
    ),
    # a pretrained HF model (eval.py hf=...)
    eval_case("hf={hf_llama}", "run={rope}", expected="pass exactly one of ckpt=PATH"),
    eval_case("hf={hf_llama}", expected="needs a corpus: pass data_path=DIR"),
    eval_case(
        "hf={hf_llama}",
        "data_path={corpus}",
        "eval.documents={corpus}/valid.txt",
        expected=("data_path={corpus}: eval.documents=", "leave data_path out"),
    ),
    eval_case(
        "hf={corpus}/nothing-here",
        "data_path={corpus}",
        expected=("could not load its config", "pass a local folder"),
    ),
    eval_case("hf={file}", "data_path={corpus}", expected="is a file; pass the model's folder"),
    eval_case("hf={hf_t5}", "data_path={corpus}", expected="is a t5 model, not a causal"),
    eval_case("hf={hf_bert}", "data_path={corpus}", expected="is not causal: its logits"),
    eval_case("hf={hf_no_weights}", "data_path={corpus}", expected="could not load its weights"),
    eval_case("hf={hf_llama}", "data_path={corpus}", "hf_context=0", expected="hf_context=0"),
    eval_case(
        "hf={hf_gpt2}",
        "data_path={corpus}",
        "eval.rope_scaling.kind=rerope",
        expected=("kind=rerope: hf=", "no rotary embedding module", "works on rotary models"),
    ),
    eval_case(
        "hf={hf_gpt2}",
        "data_path={corpus}",
        "eval.logn_scaling=true",
        expected=("eval.logn_scaling=true: hf=", "set eval.logn_scaling=false"),
    ),
    eval_case(
        "hf={hf_gpt2}",
        "data_path={corpus}",
        "eval.rope_scaling.kind=yarn",
        expected="has no rotary embedding module",
    ),
    eval_case(
        "hf={hf_gpt2}",
        "data_path={corpus}",
        "eval.factors=[1,2]",
        "eval.unsupported=error",
        expected="has learned positions 0..31",
    ),
    eval_case(
        "run={task}",
        "eval.modes=[sliding]",
        "eval.stride=4",
        expected=(
            "eval.modes=[sliding], eval.stride=4: ",
            "trained on a generated task (data=passkey)",
            "not by windows over a corpus split",
        ),
        wandb=False,
    ),
]


# ------------------------------------------------------------------- scripts without Hydra

# a benchmark that runs in seconds, should a check ever let a bad input through (argparse: the
# last value of an option wins, so each case overrides what it tests)
QUICK_BENCH = (
    "--model",
    "tiny",
    "--seq-len",
    "8",
    "--batch-size",
    "2",
    "--vocab",
    "64",
    "--steps",
    "1",
    "--rounds",
    "1",
    "--warmup",
    "0",
    "--eval-batches",
    "1",
    "--schemes",
    "nope",
    "--device",
    "cpu",
    "--out",
    "{out}/bench.md",
)


def bench(*args: str, expected: str) -> Case:
    return Case("benchmark.py", (*QUICK_BENCH, *args), (expected,))


# the generation benchmark at its smallest, for the same reason
QUICK_GENERATION = ("--model", "tiny", "--prompt", "2", "--new-tokens", "2", "--rounds", "1")
QUICK_GENERATION += ("--schemes", "nope", "--no-peer", "--out", "{out}/generation.md")


def generation(*args: str, expected: str) -> Case:
    return Case("benchmark_generation.py", (*QUICK_GENERATION, *args), (expected,))


def compare(*args: str, expected: str) -> Case:
    return Case("compare.py", args, (expected,))


def budget(*args: str, expected: str) -> Case:
    return Case("budget.py", args, (expected,))


def vocabulary(*args: str, expected: str) -> Case:
    return Case("vocabulary_change.py", args, (expected,))


def collect(*args: str, expected: str) -> Case:
    return Case("collect_study.py", args, (expected,))


def analysis(*args: str, expected: str) -> Case:
    return Case("analysis.py", args, (expected,))


def parity(*args: str, expected: str) -> Case:
    return Case("pretrained_parity.py", args, (expected,))


# {out} is the case's own output path (it must not exist afterwards); the other fields are the
# inputs made by the `script_inputs` fixture (conftest.py)
SCRIPT_BAD = [
    bench("--model", "foo", expected="argument --model: invalid choice: 'foo' (choose from"),
    bench("--attention", "foo", expected="argument --attention: invalid choice: 'foo'"),
    bench("--device", "foo", expected="argument --device: 'foo' is not a device"),
    bench("--vocab", "0", expected="argument --vocab: must be ≥ 1 (got 0)"),
    bench("--steps", "-1", expected="argument --steps: must be ≥ 1 (got -1)"),
    bench("--rounds", "0", expected="argument --rounds: must be ≥ 1 (got 0)"),
    bench("--seq-len", "0", expected="argument --seq-len: must be ≥ 1 (got 0)"),
    bench("--batch-size", "two", expected="argument --batch-size: 'two' is not a whole number"),
    bench("--eval-batches", "0", expected="argument --eval-batches: must be ≥ 1 (got 0)"),
    bench("--schemes", "nope", "foo", expected="argument --schemes: invalid choice: 'foo'"),
    bench(
        "--attention",
        "linear",
        "--schemes",
        "alibi",
        expected="--schemes alibi with --attention linear (model tiny, L=8): attention=linear "
        "cannot serve",
    ),
    bench(
        "--out", "{file}/bench.md", expected="--out {file}/bench.md: {file} is a file, so no file"
    ),
    bench("--out", "{results}", expected="--out {results} is a folder; pass the path of a file"),
    bench("--out", "/proc/poslab/bench.md", expected="/proc is not writable"),
    generation("--schemes", "foo", expected="argument --schemes: invalid choice: 'foo'"),
    generation("--new-tokens", "0", expected="argument --new-tokens: must be ≥ 1 (got 0)"),
    generation("--out", "{results}", expected="--out {results} is a folder; pass the path of a"),
    compare(
        "{good}", "--out", "{file}", expected="--out {file} is a file; pass the path of a folder"
    ),
    compare("{good}", "--out", "{file}/sub", expected="--out {file}/sub: {file} is a file, so no"),
    compare(
        "{length_abc}",
        "--out",
        "{out}",
        expected="{length_abc}/extrapolation/extrapolation.json: row 2 of 3 (rope, "
        "nonoverlapping) has length='abc', not a whole number of tokens ≥ 1",
    ),
    compare("{length_negative}", expected="row 2 of 3 (rope, nonoverlapping) has length=-5"),
    compare(
        "{length_missing}",
        "--out",
        "{out}",
        expected="row 3 of 3 (rope, nonoverlapping) has no 'length' field",
    ),
    compare("{out}/missing", expected="no such file or folder: {out}/missing"),
    compare(
        "{empty_folder}", "--out", "{out}", expected="no extrapolation/extrapolation.json under"
    ),
    compare("{file}", "--out", "{out}", expected="{file} is not a results file"),
    compare(expected="the following arguments are required: paths; see python scripts/compare.py"),
    compare("{good}", "{good}", "--out", "{out}", expected="is given twice (it would count as two"),
    budget("{good}", "--baseline", "rope", "--out", "{out}", expected="records no training steps"),
    budget(
        "{out}/missing",
        "--baseline",
        "rope",
        "--out",
        "{out}",
        expected="no such file or folder: {out}/missing",
    ),
    budget("{good}", expected="the following arguments are required: --out"),
    vocabulary(
        "{file}", "{good}", "--baseline", "rope", "--out", "{out}", expected="not a comparison.json"
    ),
    collect("{empty_folder}", "{out}", expected="{empty_folder} holds no study (study.json)"),
    analysis(
        "attention",
        "{task}",
        "--out",
        "{out}",
        expected="{task} was trained on the generated task data=passkey, not on a text corpus",
    ),
    analysis("decay", "--out", "{file}/sub", expected="--out {file}/sub: {file} is a file, so no"),
    analysis("collisions", "--out", "/proc/poslab", expected="/proc is not writable"),
    analysis(
        "attention", "{out}/no.ckpt", "--out", "{out}", expected="no such checkpoint or run folder"
    ),
    analysis("attention", "{file}", "--out", "{out}", expected="{file}"),
    analysis(
        "attention",
        "{corpus_gone}",
        "--out",
        "{out}",
        expected="{corpus_gone} was trained on data.path={gone}, which does not exist any "
        "more; pass that corpus with --data-path DIR",
    ),
    analysis(
        "attention",
        "{corpus_gone}",
        "--factor",
        "0.01",
        "--out",
        "{out}",
        expected="--factor 0.01 × the training length 16 of {corpus_gone} is fewer than 2 tokens",
    ),
    analysis(
        "attention", "{task}", "--factor", "nan", "--out", "{out}", expected="--factor must be"
    ),
    analysis(
        "attention",
        "{task}",
        "--data-path",
        "{gone}",
        "--out",
        "{out}",
        expected="--data-path {gone} does not exist",
    ),
    analysis(
        "attention",
        "{task}",
        "--split",
        "foo",
        "--out",
        "{out}",
        expected="argument --split: invalid choice: 'foo'",
    ),
    analysis(
        "theta", "{empty_folder}", "--out", "{out}", expected="run folder {empty_folder} has no"
    ),
    analysis(
        "decay", "--bases", "inf", "--out", "{out}", expected="--bases must be finite and > 1"
    ),
    parity("--archs", "mistral", expected="argument --archs: invalid choice: 'mistral'"),
    parity("--factors", "1", "--out", "{out}", expected="argument --factors: must be ≥ 2 (got 1)"),
    parity("--kinds", "--out", "{out}", expected="argument --kinds: expected at least one"),
    parity("--out", "{file}/p.md", expected="--out {file}/p.md: {file} is a file, so no file"),
    parity("--out", "{results}", expected="--out {results} is a folder; pass the path of a file"),
]
if torch.cuda.is_available():
    SCRIPT_BAD.append(
        bench("--device", "cuda:99", expected="argument --device: 'cuda:99': this machine")
    )
else:  # the case of the report: a GPU asked for where there is none
    SCRIPT_BAD.append(bench("--device", "cuda", expected="'cuda': this machine has no CUDA GPU"))
    SCRIPT_BAD.append(
        bench("--attention", "flex", expected="--attention flex trains on CUDA GPUs only")
    )


def case_problems(
    case: Case, result: subprocess.CompletedProcess, values: dict[str, str], out: Path
) -> list[str]:
    """What breaks the contract in one case's result (contract_problems, with every expected
    text and without the absent one)."""
    expected = [e.format(**values, out=out) for e in case.expected]
    problems = contract_problems(result, expected[0], out)
    problems += [f"no {e!r}" for e in expected[1:] if e not in result.stderr]
    if case.absent is not None and case.absent in result.stderr:
        problems.append(f"says {case.absent!r}")
    return problems


def run_case_process(case: Case, values: dict[str, str], out: Path) -> subprocess.CompletedProcess:
    """The case as a real process: `python train.py ...`, `python eval.py ...` or
    `python scripts/X.py ...`, run from the folder its output path is in."""
    script = {"train": REPO / "train.py", "eval": REPO / "eval.py"}.get(case.app)
    script = script or SCRIPTS / case.app
    return subprocess.run(
        [sys.executable, str(script), *case.argv(values, out)],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def nothing_written_by_eval(run: Path) -> bool:
    """A refused eval.py command wrote neither a log nor results into the run it names."""
    return not {"eval.log", "extrapolation"} & {p.name for p in run.iterdir()}
