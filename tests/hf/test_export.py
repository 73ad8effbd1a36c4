"""scripts/export_hf.py (poslab/hf/export.py): poslab models as standard HF models where the
architecture maps exactly, learned -> GPT-2 and rope -> GPT-NeoX; the HF model, loaded back
from its folder, gives poslab's logits; every other model is one line and nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, file_size_limit, run_in_process

from poslab.data.cache import TokenCache
from poslab.hf.export import export_hf, logit_gap
from poslab.model.gpt import GPT, GPTConfig
from poslab.positions.learned import LearnedPositions
from poslab.positions.rope import Rotary


@pytest.mark.parametrize("scheme", ["alibi", "t5"])
def test_any_other_trained_run_exports_with_custom_code(
    scheme, trained_runs, tmp_path, monkeypatch, capfd
):
    """The command on a run of a scheme with no native HF architecture: the folder holds
    poslab's code, the check passed (the printed gap), and it loads with trust_remote_code."""
    from transformers import AutoModelForCausalLM

    from poslab.evaluation.run import checkpoint_of_run
    from poslab.model.build import load_checkpoint

    run = trained_runs[scheme][0]
    out = tmp_path / "hf"
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    result = run_in_process(
        "export_hf.py", [str(run), "--out", str(out)], tmp_path, monkeypatch, capfd
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PoslabForCausalLM, custom code" in result.stdout
    assert "trust_remote_code=True" in result.stdout
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    model, config = load_checkpoint(checkpoint_of_run(run))
    assert logit_gap(model, hf, 4 * int(config["data"]["seq_len"])) < 1e-5


@pytest.mark.parametrize("scheme", ["rope", "learned"])
def test_a_trained_run_exports_and_loads_back_with_equal_logits(
    scheme, trained_runs, tmp_path, monkeypatch, capfd
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from poslab.evaluation.run import checkpoint_of_run
    from poslab.model.build import load_checkpoint

    run = trained_runs[scheme][0]
    out = tmp_path / "hf"
    result = run_in_process(
        "export_hf.py", [str(run), "--out", str(out)], tmp_path, monkeypatch, capfd
    )
    assert result.returncode == 0, result.stderr[-2000:]
    architecture = {"rope": "GPTNeoXForCausalLM", "learned": "GPT2LMHeadModel"}[scheme]
    assert architecture in result.stdout
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == architecture
    model, config = load_checkpoint(checkpoint_of_run(run))
    assert logit_gap(model, hf, int(config["data"]["seq_len"])) < 1e-4
    # the tokenizer: the same ids as poslab's for a line of the corpus
    ours = TokenCache.from_config(config["data"]).tokenizer()
    theirs = AutoTokenizer.from_pretrained(out)
    line = " the a1 n3 v3 the n7 . "
    assert theirs(line, add_special_tokens=False)["input_ids"] == ours.encode(line).ids


@pytest.mark.parametrize(
    "pairing,fraction,bias",
    [("half", 1.0, True), ("half", 0.5, False), ("interleaved", 0.5, False)],
)
def test_rope_exports_as_gpt_neox_for_either_pairing_and_without_biases(
    pairing, fraction, bias, corpus, tmp_path
):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, n_layer=2, n_head=4, d_model=32, bias=bias)
    pos = Rotary(32, 4, pairing=pairing, fraction=fraction, base=500.0)
    model = GPT(config, pos).eval()
    with torch.no_grad():  # away from the init, so a swapped or zeroed tensor would show
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    hf = export_hf(model, {"pos_name": "rope"}, tokenizer, tmp_path / "hf")
    assert logit_gap(model, hf, 40) < 1e-4
    assert type(hf).__name__ == "GPTNeoXForCausalLM"


def test_learned_exports_as_gpt2_without_biases(tmp_path):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=64, n_layer=2, n_head=4, d_model=32, bias=False),
        LearnedPositions(32, 4, max_positions=24),
    ).eval()
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    hf = export_hf(model, {"pos_name": "learned"}, tokenizer, tmp_path / "hf")
    assert logit_gap(model, hf, 24) < 1e-4


@pytest.mark.parametrize(
    "case",
    [
        ("task", [], "was trained on a generated task (data=passkey), whose tokens have no"),
        ("rope", ["--out", "{file}"], "is not an empty folder"),
        # a path that does not exist is said so (#60; it was "not a run folder")
        ("nowhere", [], "nowhere does not exist; pass a run folder or a .ckpt file"),
        # issue #60: a --data-path that is no folder, or that the run would not read
        ("rope", ["--data-path", "/no/such/corpus"], "--data-path /no/such/corpus: no such"),
        ("rope", ["--data-path", "{corpus}"], "this run recorded its tokenizer"),
    ],
    ids=["task", "out-not-empty", "no-such-run", "no-data-path", "unread-data-path"],
)
def test_a_model_that_does_not_export_is_one_line(
    case, trained_runs, corpus, tmp_path, monkeypatch, capfd, request
):
    scheme, extra, expected = case
    run = trained_runs[scheme][0] if scheme in trained_runs else tmp_path / scheme
    run = request.getfixturevalue("task_run") if scheme == "task" else run
    out = tmp_path / "hf"
    extra = [a.format(file=corpus / "train.txt", corpus=corpus) for a in extra]
    args = [str(run), "--out", str(out), *extra]
    result = run_in_process("export_hf.py", args, tmp_path, monkeypatch, capfd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert not out.exists()


def test_an_exported_run_evaluated_as_a_pretrained_model_gives_the_runs_own_table(
    trained_runs, corpus, tmp_path, monkeypatch, capfd
):
    """Export, then eval.py hf=: the exported tokenizer reads the corpus into the ids of
    poslab's token cache (a newline is the <eos> lines ended with), so every row equals the
    run's own evaluation: tokens, words, bytes and perplexity."""
    import json

    run = trained_runs["rope"][0]
    exported = tmp_path / "hf"
    args = [str(run), "--out", str(exported)]
    assert run_in_process("export_hf.py", args, tmp_path, monkeypatch, capfd).returncode == 0
    shared = [
        "eval.factors=[1,2,4]",
        "eval.modes=[nonoverlapping,sliding]",
        "eval.max_tokens=1500",
        "eval.precision=32-true",
        "wandb=false",
    ]
    tables = {}
    for name, source in (("run", f"run={run}"), ("hf", f"hf={exported}")):
        out = tmp_path / name
        extra = [f"data_path={corpus}"] if name == "hf" else []
        result = run_in_process(
            "eval", [source, *extra, *shared, f"out_dir={out}"], tmp_path, monkeypatch, capfd
        )
        assert result.returncode == 0, result.stderr[-2000:]
        tables[name] = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    assert len(tables["run"]) == len(tables["hf"]) == 6
    for ours, theirs in zip(tables["run"], tables["hf"], strict=True):
        for key in ("mode", "length", "tokens", "words", "bytes"):
            assert ours[key] == theirs[key], key
        assert theirs["ppl"] == pytest.approx(ours["ppl"], rel=1e-5)


@pytest.mark.parametrize("app", ["export_hf.py", "eval"])
def test_without_the_hf_extra_each_hf_command_says_what_to_install(
    app, trained_runs, corpus, tmp_path, monkeypatch, capfd
):
    """transformers missing (as without `pip install "poslab[hf]"`): one line, before any work."""
    import sys

    run = trained_runs["alibi"][0]  # trained first (Lightning looks for transformers)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    out = tmp_path / "hf"
    args = (
        [str(run), "--out", str(out)]
        if app == "export_hf.py"
        else [f"hf={run}", f"data_path={corpus}", f"out_dir={out}", "wandb=false"]
    )
    result = run_in_process(app, args, tmp_path, monkeypatch, capfd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: ") and 'pip install "poslab[hf]"' in lines[0], lines[0]
    assert not out.exists()


def test_a_version_1_vocabulary_with_merged_ids_does_not_export():
    """A run whose word vocabulary put <eos> at a word's id (data.tokenizer_version=1 on a text
    holding <unk>): no HF tokenizer encodes as its training did, so the export says so in one
    line; the fixed vocabulary of the same text exports."""
    from poslab.data.tokens import read_tokenizer, train_tokenizer
    from poslab.errors import ConfigError
    from poslab.hf.export import check_exportable_tokenizer

    lines = ["the cat sat", "the dog <unk> ran", "a b c the the"]
    legacy = read_tokenizer(train_tokenizer(lines, "word", None, version=1).to_str())
    with pytest.raises(ConfigError, match="data.tokenizer_version=2"):
        check_exportable_tokenizer(legacy)
    check_exportable_tokenizer(read_tokenizer(train_tokenizer(lines, "word", None, 2).to_str()))


def test_the_exported_tokenizer_reads_a_text_with_unk_into_the_caches_ids(tmp_path):
    """WikiText's text holds <unk> as a word: the exported tokenizer of a (version 2) word
    vocabulary, every token at its own id, gives the ids of poslab's token cache, <eos> and
    <unk> included."""
    from transformers import PreTrainedTokenizerFast

    from poslab.hf.export import hf_tokenizer

    lines = [" the cat sat . ", " the dog <unk> ran . ", " a <unk> cat , the end . "] * 20
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    cache = TokenCache(
        "toy", path=str(tmp_path), cache_dir=str(tmp_path / "c"), tokenizer_version=2
    )
    ours = [int(i) for i in cache.split("validation").ids]
    vocab = cache.tokenizer().get_vocab()
    assert len(set(vocab.values())) == len(vocab)
    theirs = hf_tokenizer(cache.tokenizer())
    assert isinstance(theirs, PreTrainedTokenizerFast)
    text = (tmp_path / "valid.txt").read_text()
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours


def start_export(run: Path, out: Path) -> subprocess.Popen:
    """scripts/export_hf.py as a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "scripts" / "export_hf.py"), str(run), "--out", str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_writing(export: subprocess.Popen, out: Path) -> None:
    """Until the export has begun writing: its partial folder beside `out`, or `out` itself."""
    deadline = time.monotonic() + 120
    while not (out.exists() or list(out.parent.glob(f".{out.name}.*.partial"))):
        assert export.poll() is None, export.communicate()
        assert time.monotonic() < deadline, "the export did not start writing"
        time.sleep(0.002)


@pytest.mark.slow  # starts processes: 20-30 s of the fast suite
def test_a_killed_export_leaves_no_folder_that_looks_finished(trained_runs, tmp_path):
    """SIGKILL while it writes: no --out (the export is renamed there only once checked);
    the same command again exports, and removes what the killed one left."""
    run, out = trained_runs["rope"][0], tmp_path / "hf"
    export = start_export(run, out)
    try:
        wait_for_writing(export, out)
        export.send_signal(signal.SIGKILL)
        export.wait(timeout=60)
    finally:
        export.kill()
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    again = start_export(run, out)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-2000:]
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".hf.*.partial"))


@pytest.mark.slow  # starts processes: 20-30 s of the fast suite
def test_a_second_export_to_the_same_out_is_refused_in_one_line(
    trained_runs, tmp_path, monkeypatch, capfd
):
    """One export writes --out (stopped with SIGSTOP while it does); a second one to the same
    --out is refused in one line naming the first's pid, and the first then finishes."""
    run, out = trained_runs["rope"][0], tmp_path / "hf"
    first = start_export(run, out)
    try:
        wait_for_writing(first, out)
        first.send_signal(signal.SIGSTOP)
        result = run_in_process(
            "export_hf.py", [str(run), "--out", str(out)], tmp_path, monkeypatch, capfd
        )
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"is in use by another export (scripts/export_hf.py) (pid {first.pid})" in lines[0]
    assert first.returncode == 0, stderr[-2000:]
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize("custom_code", [False, True], ids=["native", "custom-code"])
def test_a_full_disk_is_one_line_and_leaves_nothing(
    custom_code, trained_runs, tmp_path, monkeypatch, capfd
):
    """No room for the weights (a file-size limit: a real EFBIG, as a full disk's ENOSPC): one
    line, exit 2, no --out and no partial folder (safetensors raised its own error type)."""
    from poslab.model.build import load_checkpoint
    from poslab.run.run_folder import checkpoint_of_run

    run, out = trained_runs["rope"][0], tmp_path / "hf"
    model, _ = load_checkpoint(checkpoint_of_run(run))
    weights = sum(t.numel() * 4 for t in model.state_dict().values())
    assert weights > 64 * 1024  # larger than the limit; the tokenizer and config are smaller
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    args = [str(run), "--out", str(out), *(["--custom-code"] if custom_code else [])]
    with file_size_limit(64 * 1024):
        result = run_in_process("export_hf.py", args, tmp_path, monkeypatch, capfd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: no room to write the export"), lines[0]
    assert not out.exists() and not list(tmp_path.glob(".hf.*.partial"))
