"""eval.py hf=MODEL (poslab/hf/pretrained.py): a pretrained HF causal LM in poslab's evaluation.

Tiny random models of four architectures are saved to folders and loaded back through
`from_pretrained` (the path a hub id takes, without the hub). Checked: poslab's scorer gives the
model's own `labels=` loss token for token; poslab's eval-time frequencies on the model give the
logits of HF's own `rope_parameters` of the same kind, dynamic_ntk and longrope at each window's
span; a model shipping HF's `dynamic` or `longrope` is scored as a fresh model scores each
window, in any order, and refuses eval-time options naming the one to unset; the command writes
the same report files as for a poslab checkpoint, never over an earlier evaluation, and
compare.py sets the model beside trained runs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_in_process
from hf_models import ARCHITECTURES, CONTEXT, hf_model, tokenizer_for

from poslab.errors import ConfigError
from poslab.hf.pretrained import (
    PretrainedLM,
    encode_text,
    load_pretrained,
    models_per_length,
    rotary_state,
)
from poslab.hf.tiny_hf import FREQUENCY_KINDS, frequency_kind
from poslab.model.losses import linear_token_nll
from poslab.positions.rope_scaling import RopeScaling

ROTARY = [a for a in ARCHITECTURES if a != "gpt2"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def vocab(corpus) -> int:
    return len(tokenizer_for(corpus))


def wrapped(model, scaling: RopeScaling | None = None, length: int = CONTEXT) -> PretrainedLM:
    return PretrainedLM(model, "tiny", rotary_state(model, "tiny", scaling, length))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_scorer_gives_the_models_own_loss_token_for_token(arch, vocab):
    model = hf_model(arch, vocab)
    ids = torch.randint(0, vocab, (3, CONTEXT + 1), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        logits = model(input_ids=ids[:, :-1]).logits
        theirs = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )
        mean_loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
        ours = wrapped(model).hidden_states(ids[:, :-1])
        ours = linear_token_nll(ours, model.get_output_embeddings().weight, ids[:, 1:])
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # HF's labels= loss shifts inside: the mean over the same next-token targets but the last
    torch.testing.assert_close(ours[:, :-1].mean(), mean_loss, atol=1e-5, rtol=1e-5)


# dynamic_ntk at s = 2 over 4× the context: HF's dynamic base then differs from NTK at s = 4
FACTOR = {"pi": 4.0, "dynamic_ntk": 2.0, "yarn": 4.0, "llama3": 4.0, "longrope": 4.0}


@pytest.mark.parametrize("kind", FREQUENCY_KINDS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "neox_partial"])
def test_poslab_frequencies_on_the_model_equal_hfs_own_rope_parameters(arch, kind, vocab):
    length = 4 * CONTEXT
    plain = hf_model(arch, vocab)
    pairs = rotary_state(plain, "tiny", None, CONTEXT).inv_freq[0].shape[-1]
    ours, theirs = frequency_kind(kind, FACTOR[kind], pairs)
    native = hf_model(arch, vocab, **theirs)  # the same weights (seed), HF's own scaling
    scaling = RopeScaling(**ours, train_length=CONTEXT)
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = native(input_ids=ids).logits
        got = wrapped(plain, scaling, length)(ids)
        unscaled = wrapped(plain)(ids)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    # not vacuous: the kind moves the logits by far more than the tolerance
    assert (got - unscaled).abs().max() > 10 * 2e-5


def test_the_trained_frequencies_come_back_after_a_scaled_length(vocab):
    """One HF model serves every length: a length evaluated after a scaled one reads the
    frequencies it was trained with."""
    model = hf_model("llama", vocab)
    ids = torch.randint(0, vocab, (1, CONTEXT), generator=torch.Generator().manual_seed(3))
    plain = wrapped(model)
    with torch.inference_mode():
        before = plain(ids)
        wrapped(model, RopeScaling(kind="pi", factor=4.0, train_length=CONTEXT))(ids)
        torch.testing.assert_close(plain(ids), before, atol=0, rtol=0)


# the kinds whose frequencies read the length: dynamic NTK and LongRoPE, HF's `dynamic` and
# `longrope` (made-up per-pair factors), each at the factor FACTOR gives it
READS_LENGTH = ("dynamic_ntk", "longrope")
# forwards in the order an evaluation may run them: (wrapper length, tokens). Shorter and longer
# than the context, a length again after a longer one (HF's dynamic keeps the longest input's
# frequencies between calls), two batches in a row, and a split's last, shorter window (40
# tokens through the wrapper of 128)
FORWARDS = [(16, 16), (64, 64), (64, 64), (16, 16), (128, 128), (64, 64), (128, 40), (32, 32)]


def pairs_of(model) -> int:
    return rotary_state(model, "tiny", None, CONTEXT).inv_freq[0].shape[-1]


@pytest.mark.parametrize("kind", READS_LENGTH)
def test_a_model_that_ships_a_rotary_reading_the_length_is_scored_as_a_fresh_model_scores_it(
    kind, corpus, vocab, tmp_path
):
    """A model saved with HF's own `dynamic` or `longrope` rope_parameters, evaluated as shipped
    through eval.py's loader: every forward gives a fresh HF model's logits, whatever ran
    before (neither poslab nor HF's own state between calls leaks into a later window)."""
    _, theirs = frequency_kind(kind, FACTOR[kind], pairs_of(hf_model("llama", vocab)))
    folder = tmp_path / kind
    hf_model("llama", vocab, **theirs).save_pretrained(folder)
    tokenizer_for(corpus).save_pretrained(folder)
    model = load_pretrained(str(folder), CPU, "32-true")[0]
    (rotary,) = [m for m in model.modules() if hasattr(m, "original_inv_freq")]
    trained = rotary.original_inv_freq.clone()
    models = models_per_length(model, "tiny", None, [16, 32, 64, 128], CONTEXT, CPU)
    ids = torch.randint(0, vocab, (2, 128), generator=torch.Generator().manual_seed(4))
    for length, tokens in FORWARDS:
        fresh = hf_model("llama", vocab, **theirs)  # the same weights (seed)
        with torch.inference_mode():
            expected = fresh(input_ids=ids[:, :tokens]).logits
            got = models[length](ids[:, :tokens])
        gap = float((got - expected).abs().max())
        assert gap < 1e-5, (length, tokens, gap)
    assert torch.equal(rotary.original_inv_freq, trained)


@pytest.mark.parametrize("kind", READS_LENGTH)
def test_frequency_kinds_that_read_the_length_follow_each_windows_span(kind, vocab):
    """dynamic_ntk and longrope through the rotary module read each window's span, as poslab's
    own Rotary and the attention hook do: a split's last, shorter window at a length gets the
    frequencies HF's own kind gives a fresh model on that window, not the nominal length's."""
    model = hf_model("llama", vocab)
    ours, theirs = frequency_kind(kind, FACTOR[kind], pairs_of(model))
    length = 4 * CONTEXT
    scored = models_per_length(model, "tiny", ours, [length], CONTEXT, CPU)[length]
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(5))
    for tokens in (length, 40, 20, length):
        with torch.inference_mode():
            expected = hf_model("llama", vocab, **theirs)(input_ids=ids[:, :tokens]).logits
            got = scored(ids[:, :tokens])
        gap = float((got - expected).abs().max())
        assert gap < 2e-5, (tokens, gap)


@pytest.mark.parametrize(
    ("options", "asked", "undo"),
    [
        ({"kind": "none", "logn": True}, "eval.logn_scaling=true", "set eval.logn_scaling=false"),
        (
            {"kind": "pi", "factor": 2.0},
            "eval.rope_scaling.kind=pi",
            "set eval.rope_scaling.kind=none",
        ),
    ],
)
def test_a_model_that_ships_a_scaled_rotary_refuses_eval_time_options_naming_the_one_to_unset(
    options, asked, undo, vocab
):
    model = hf_model("llama", vocab, rope_type="dynamic", factor=2.0)
    with pytest.raises(ConfigError) as err:
        models_per_length(model, "tiny", options, [2 * CONTEXT], CONTEXT, CPU)
    message = str(err.value)
    assert message.startswith(f"{asked}: hf=tiny already ships rope_type=dynamic"), message
    assert undo in message and "to evaluate it as shipped" in message
    if options["kind"] == "none":  # not the option the user already set
        assert "eval.rope_scaling.kind=none" not in message
    assert "\n" not in message


def test_encoded_text_carries_every_word_and_byte_once(corpus):
    tokenizer = tokenizer_for(corpus)
    lines = (corpus / "valid.txt").read_text().splitlines()
    split = encode_text(tokenizer, lines, chunk_lines=7)  # chunks end inside the split too
    text = "".join(line + "\n" for line in lines)
    assert split.ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert int(split.words.sum()) == sum(len(line.split()) + 1 for line in lines)
    assert int(split.bytes.sum()) == len(text.encode("utf-8"))


def test_eval_py_on_a_pretrained_model_writes_the_reports_and_never_overwrites(
    hf_models, corpus, tmp_path, monkeypatch, capfd
):
    args = [
        f"hf={hf_models['llama']}",
        f"data_path={corpus}",
        "eval.factors=[1,2,4]",
        "eval.modes=[nonoverlapping,sliding]",
        "eval.max_tokens=1500",
        "eval.rope_scaling.kind=yarn",
    ]
    first = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert first.returncode == 0, first.stderr[-2000:]
    folder = tmp_path / "outputs" / "pretrained" / "llama"
    reports = folder / "extrapolation"
    names = {p.name for p in reports.iterdir()}
    assert {"extrapolation.json", "extrapolation.csv", "extrapolation.md"} <= names
    assert {"extrapolation_ppl.png", "extrapolation_loss_by_position.png"} <= names
    rows = json.loads((reports / "extrapolation.json").read_text())
    assert {r["length"] for r in rows} == {CONTEXT, 2 * CONTEXT, 4 * CONTEXT}
    assert {r["factor"] for r in rows} == {1.0, 2.0, 4.0}  # multiples of its context
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in rows)
    assert rows[0]["scheme"] == "llama + yarn s=auto"
    assert (folder / "eval.log").is_file()
    # W&B (offline in tests): a job_type=eval run in the model's folder
    assert list((folder / "wandb").glob("offline-run-*"))
    before = (reports / "extrapolation.json").read_bytes()
    again = run_in_process("eval", args[:-1], tmp_path, monkeypatch, capfd)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (reports / "extrapolation.json").read_bytes() == before
    (second,) = [p for p in folder.iterdir() if p.name.startswith("extrapolation-")]
    rows = json.loads((second / "extrapolation.json").read_text())
    assert rows[0]["scheme"] == "llama"


def test_a_pretrained_model_is_a_row_beside_trained_runs(
    hf_models, corpus, trained_runs, tmp_path, monkeypatch, capfd
):
    out = tmp_path / "smol"
    args = [
        f"hf={hf_models['gpt_neox']}",
        f"data_path={corpus}",
        "eval.factors=[1,2]",
        "eval.max_tokens=1500",
        f"out_dir={out}",
        "wandb=false",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    table = tmp_path / "table"
    compare = [str(trained_runs["rope"][0]), str(out), "--out", str(table)]
    result = run_in_process("compare.py", compare, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    text = next(table.glob("*.md")).read_text()
    assert "gpt_neox" in text and "rope" in text
