"""Reliability of the scripts without Hydra (benchmark.py, compare.py, analysis.py): every bad
input is one `error: ...` line on stderr with exit code 2, before any slow work, and leaves
nothing behind (no output folder, no report file, nothing new beside the inputs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import REPO, compose_train, contract_problems, make_corpus, train_in_process

SCRIPTS = REPO / "scripts"
# a benchmark that runs in seconds, should a check ever let a bad input through (argparse: the
# last value of an option wins, so each case overrides what it tests)
QUICK_BENCH = ["--model", "tiny", "--seq-len", "8", "--batch-size", "2", "--vocab", "64",
               "--steps", "1", "--rounds", "1", "--warmup", "0", "--eval-batches", "1",
               "--schemes", "nope", "--device", "cpu", "--out", "{out}/bench.md"]  # fmt: skip


def bench(*args: str) -> tuple[str, list[str]]:
    return "benchmark.py", [*QUICK_BENCH, *args]


def compare(*args: str) -> tuple[str, list[str]]:
    return "compare.py", list(args)


def analysis(*args: str) -> tuple[str, list[str]]:
    return "analysis.py", list(args)


# (case, expected text in the one error line). {out} is the case's own output path (it must not
# exist afterwards); the other fields are the inputs made by `inputs` below.
BAD_INPUTS = [
    (bench("--model", "foo"), "argument --model: invalid choice: 'foo' (choose from"),
    (bench("--attention", "foo"), "argument --attention: invalid choice: 'foo'"),
    (bench("--device", "foo"), "argument --device: 'foo' is not a device"),
    (bench("--vocab", "0"), "argument --vocab: must be ≥ 1 (got 0)"),
    (bench("--steps", "-1"), "argument --steps: must be ≥ 1 (got -1)"),
    (bench("--rounds", "0"), "argument --rounds: must be ≥ 1 (got 0)"),
    (bench("--seq-len", "0"), "argument --seq-len: must be ≥ 1 (got 0)"),
    (bench("--batch-size", "two"), "argument --batch-size: 'two' is not a whole number"),
    (bench("--eval-batches", "0"), "argument --eval-batches: must be ≥ 1 (got 0)"),
    (bench("--schemes", "nope", "foo"), "argument --schemes: invalid choice: 'foo'"),
    (bench("--attention", "linear", "--schemes", "alibi"),
     "--schemes alibi with --attention linear (model tiny, L=8): attention=linear cannot serve"),
    (bench("--out", "{file}/bench.md"), "--out {file}/bench.md: {file} is a file, so no file"),
    (bench("--out", "{results}"), "--out {results} is a folder; pass the path of a file"),
    (bench("--out", "/proc/poslab/bench.md"), "/proc is not writable"),
    (compare("{good}", "--out", "{file}"), "--out {file} is a file; pass the path of a folder"),
    (compare("{good}", "--out", "{file}/sub"), "--out {file}/sub: {file} is a file, so no"),
    (compare("{length_abc}", "--out", "{out}"),
     "{length_abc}/extrapolation/extrapolation.json: row 2 of 3 (rope, nonoverlapping) has "
     "length='abc', not a whole number of tokens ≥ 1"),
    (compare("{length_negative}"), "row 2 of 3 (rope, nonoverlapping) has length=-5"),
    (compare("{length_missing}", "--out", "{out}"), "row 3 of 3 (rope, nonoverlapping) has no "
                                                    "'length' field"),
    (compare("{out}/missing"), "no such file or folder: {out}/missing"),
    (compare("{empty_folder}", "--out", "{out}"), "no extrapolation/extrapolation.json under"),
    (compare("{file}", "--out", "{out}"), "{file} is not a results file"),
    (compare(), "the following arguments are required: paths; see python scripts/compare.py"),
    (analysis("attention", "{task}", "--out", "{out}"),
     "{task} was trained on the generated task data=passkey, not on a text corpus"),
    (analysis("decay", "--out", "{file}/sub"), "--out {file}/sub: {file} is a file, so no"),
    (analysis("collisions", "--out", "/proc/poslab"), "/proc is not writable"),
    (analysis("attention", "{out}/no.ckpt", "--out", "{out}"), "no such checkpoint or run folder"),
    (analysis("attention", "{file}", "--out", "{out}"), "{file}"),
    (analysis("attention", "{corpus_gone}", "--out", "{out}"),
     "{corpus_gone} was trained on data.path={gone}, which does not exist any more; pass that "
     "corpus with --data-path DIR"),
    (analysis("attention", "{corpus_gone}", "--factor", "0.01", "--out", "{out}"),
     "--factor 0.01 × the training length 16 of {corpus_gone} is fewer than 2 tokens"),
    (analysis("attention", "{task}", "--factor", "nan", "--out", "{out}"), "--factor must be"),
    (analysis("attention", "{task}", "--data-path", "{gone}", "--out", "{out}"),
     "--data-path {gone} does not exist"),
    (analysis("attention", "{task}", "--split", "foo", "--out", "{out}"),
     "argument --split: invalid choice: 'foo'"),
    (analysis("theta", "{empty_folder}", "--out", "{out}"), "run folder {empty_folder} has no"),
    (analysis("decay", "--bases", "inf", "--out", "{out}"), "--bases must be finite and > 1"),
]  # fmt: skip
if torch.cuda.is_available():
    BAD_INPUTS.append((bench("--device", "cuda:99"), "argument --device: 'cuda:99': this machine"))
else:  # the case of the report: a GPU asked for where there is none
    BAD_INPUTS.append((bench("--device", "cuda"), "'cuda': this machine has no CUDA GPU"))
    BAD_INPUTS.append((bench("--attention", "flex"), "--attention flex trains on CUDA GPUs only"))


def result_rows() -> list[dict]:
    """Three rows of one run as eval.py writes them (the fields compare.py reads)."""
    return [
        {"scheme": "rope", "train_length": 16, "mode": "nonoverlapping", "split": "validation",
         "length": n, "factor": n / 16, "status": "ok", "loss": 3.0, "ppl": 20.0}
        for n in (16, 32, 64)
    ]  # fmt: skip


def write_results(folder: Path, rows: list[dict]) -> Path:
    path = folder / "extrapolation" / "extrapolation.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rows))
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inputs a new user might pass by mistake: hand-edited results, a regular file, an empty
    folder, a checkpoint of a generated task, one whose corpus was deleted."""
    root = tmp_path_factory.mktemp("inputs")
    good = result_rows()
    abc, negative, missing = result_rows(), result_rows(), result_rows()
    abc[1]["length"], negative[1]["length"] = "abc", -5
    del missing[2]["length"]
    from poslab.training import run_training

    task = root / "task_run"
    run_training(compose_train(["data=passkey", "pos=rope", "model=tiny", "data.seq_len=32",
                                "data.batch_size=4", "data.val_examples=8",
                                "trainer.max_steps=2", "trainer.enable_progress_bar=false",
                                "eval.after_train=false", "logger=none"], task))  # fmt: skip
    gone = make_corpus(root / "gone_corpus", n_train=200, n_valid=40)
    train_in_process("rope", gone, root / "corpus_gone",
                     ["trainer.max_steps=2", "eval.after_train=false", "logger=none"])  # fmt: skip
    shutil.rmtree(gone)
    (root / "empty_folder").mkdir()
    (root / "file").write_text("not a checkpoint, not results\n")
    return {
        "good": write_results(root / "good", good),
        "length_abc": write_results(root / "length_abc", abc),
        "length_negative": write_results(root / "length_negative", negative),
        "length_missing": write_results(root / "length_missing", missing),
        "results": root / "good",
        "task": task,
        "corpus_gone": root / "corpus_gone",
        "gone": gone,
        "empty_folder": root / "empty_folder",
        "file": root / "file",
    }


def run_case(script: str, args: list[str], values: dict[str, str], out: Path):
    values = {**values, "out": str(out)}
    cmd = [sys.executable, str(SCRIPTS / script), *(a.format(**values) for a in args)]
    return subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, timeout=180)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_every_bad_input_is_one_line_and_exit_code_2(inputs, tmp_path):
    assert len(BAD_INPUTS) >= 36
    values = {k: str(v) for k, v in inputs.items()}
    root = inputs["file"].parent
    before = listing(root)
    with ThreadPoolExecutor(max_workers=3) as pool:  # the processes wait on imports mostly
        futures = [
            pool.submit(run_case, script, args, values, tmp_path / f"case{i}")
            for i, ((script, args), _) in enumerate(BAD_INPUTS)
        ]
        results = [f.result() for f in futures]
    failures = []
    for i, (((script, args), expected), result) in enumerate(zip(BAD_INPUTS, results, strict=True)):
        out = tmp_path / f"case{i}"
        problems = contract_problems(result, expected.format(**values, out=out), out)
        if problems:
            failures.append(f"{script} {args}: {', '.join(problems)}\n{result.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
    # nothing written beside the inputs either (compare's default <first path>/comparison, a
    # report under --out {results})
    assert listing(root) == before
    assert not os.listdir(tmp_path)
