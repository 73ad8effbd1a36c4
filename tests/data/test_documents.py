"""eval.documents (data/documents.py): a corpus of long documents scored per document, on
real files, the tiny trained rope run and a tiny saved HF model.

Checked: each document's loss is that of its own prefix scored alone (computed here from the
model's logits, not through poslab's scorer); a document shorter than a length is left out
there and counted; a length no document reaches is a skipped row the report says; eval.py
writes the documents column; each bad input is one `error:` line before any scoring; the
tokens and word and byte counts of a whole document are those of the stream's tokenization."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import contract_problems, eval_cfg, run_in_process
from hf_models import CONTEXT, tokenizer_for

from poslab.data.cache import TokenCache
from poslab.data.documents import encoder_of_pretrained, encoder_of_run, load_documents
from poslab.data.tokens import EOS, encode_lines, train_tokenizer
from poslab.errors import ConfigError
from poslab.evaluation.plan import plan_checkpoint
from poslab.evaluation.run import evaluate_checkpoint
from poslab.hf.pretrained import encode_text

# the toy corpus' words (conftest.make_corpus), so the word tokenizer knows them
SENTENCE = "the a1 n3 v3 the n7 ."


def words(n: int) -> str:
    """A line of exactly `n` words (the word tokenizer: n tokens, and its <eos>)."""
    return " ".join((SENTENCE.split() * (n // 7 + 1))[:n])


def documents_folder(root: Path) -> Path:
    """Three documents of several lines, in files whose name order is not their length order."""
    root.mkdir()
    lines = {"b.txt": [12, 30, 40], "a.txt": [5, 10], "c.txt": [20, 0, 9]}  # 85, 17, 32 tokens
    for name, counts in lines.items():
        (root / name).write_text("".join(words(n) + "\n" for n in counts))
    (root / "notes.md").write_text(words(90))  # not a .txt: not a document
    (root / ".hidden.txt").write_text(words(90))
    return root


def own_loss(model, ids: list[int], length: int) -> float:
    """The mean NLL of the first `length` of `ids` (ids[0] is the start token), from the
    model's logits over exactly that prefix."""
    x = torch.tensor(ids[: length + 1])
    with torch.inference_mode():
        logits = model(x[None, :-1])
        logits = logits.logits if hasattr(logits, "logits") else logits
    return F.cross_entropy(logits[0].double(), x[1:]).item()


@pytest.fixture
def rope(trained_runs) -> Path:
    return trained_runs["rope"][0]


def test_each_documents_score_is_its_own_prefix_scored_alone(rope, tmp_path):
    folder = documents_folder(tmp_path / "docs")
    ckpt = rope / "checkpoints" / "best.ckpt"
    cfg = eval_cfg(documents=str(folder), max_tokens=None, precision="32-true", factors=[1, 2, 4])
    rows = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "out")
    plan = plan_checkpoint(ckpt, cfg)
    tokenizer = TokenCache.from_config(plan.model_config["data"]).tokenizer()
    eos = tokenizer.token_to_id(EOS)
    docs = {}
    for file in sorted(folder.glob("[!.]*.txt")):
        lines = file.read_text().splitlines()
        docs[file.name] = [eos] + [i for line in lines for i in tokenizer.encode(line).ids + [eos]]
    assert {n: len(d) - 1 for n, d in docs.items()} == {"a.txt": 17, "b.txt": 85, "c.txt": 32}
    by_length = {r["length"]: r for r in rows}
    assert [r["mode"] for r in rows] == ["documents"] * 3
    # 16: every document; 32: c.txt has exactly 32, a.txt is left out; 64: b.txt alone
    expected = {16: ["a.txt", "b.txt", "c.txt"], 32: ["b.txt", "c.txt"], 64: ["b.txt"]}
    for length, names in expected.items():
        row = by_length[length]
        assert row["status"] == "ok" and row["documents"] == len(names)
        assert [name for name, _ in row["document_losses"]] == names
        assert row["tokens"] == length * len(names)
        for name, loss in row["document_losses"]:
            theirs = own_loss(plan.models[length], docs[name], length)
            assert loss == pytest.approx(theirs, rel=1e-4, abs=1e-5), (length, name)
        mean = sum(loss for _, loss in row["document_losses"]) / len(names)
        assert row["ppl"] == pytest.approx(math.exp(mean), rel=1e-6)  # every document N tokens
        assert row["word_ppl"] == pytest.approx(row["ppl"], rel=1e-6)  # a word per token
        ppls = [math.exp(loss) for _, loss in row["document_losses"]]
        assert row["document_ppl_mean"] == pytest.approx(sum(ppls) / len(ppls), rel=1e-6)


def test_short_documents_are_left_out_counted_and_a_length_none_reaches_is_skipped(
    rope, tmp_path, monkeypatch, capfd
):
    """A .txt file, one document per line (a blank line is none), through `eval.py run=`: the
    first eval.max_documents long enough at each length, the count in every file, a skipped
    row where no document is as long, said in the report."""
    source = tmp_path / "docs.txt"
    # 11, 41, 21 and 71 tokens (each line's words and its <eos>), line 3 blank
    source.write_text("\n".join([words(10), words(40), "  ", words(20), words(70)]) + "\n")
    out = tmp_path / "out"
    args = [
        f"run={rope}",
        f"eval.documents={source}",
        "eval.max_documents=2",
        "eval.factors=[1,2,4,8]",
        "eval.precision=32-true",
        f"out_dir={out}",
        "wandb=false",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    chosen = {r["length"]: [n for n, _ in r.get("document_losses", [])] for r in rows}
    assert chosen == {
        16: ["line 2", "line 4"],  # line 5 would be a third: max_documents=2
        32: ["line 2", "line 5"],  # line 4 (21 tokens) is too short
        64: ["line 5"],
        128: [],
    }
    assert [r["documents"] for r in rows] == [2, 2, 1, 0]
    assert [r["status"] for r in rows][:3] == ["ok"] * 3
    assert rows[3]["status"] == "skipped: no document has 128 tokens (the longest has 71)"
    assert "ppl" not in rows[3]  # never a number for a length not scored
    with open(out / "extrapolation" / "extrapolation.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["documents"] for r in table] == ["2", "2", "1", "0"]
    md = (out / "extrapolation" / "extrapolation.md").read_text()
    assert f"documents of {source} (1–2 documents per length" in md
    assert "— = a length no document reaches (skipped)" in md
    assert "| documents |" in md and md.count("—") >= 2  # the 128 cell and the legend
    # the console: what was read, per length, and the table with its legend
    assert "documents scored per length: 16: 2, 32: 2, 64: 1, 128: 0" in result.stdout
    assert "a length no document reaches" in result.stdout


def test_eval_py_on_a_pretrained_model_scores_documents_without_a_corpus(
    hf_models, corpus, tmp_path, monkeypatch, capfd
):
    """hf= with eval.documents (a .jsonl of proof-pile's shape) needs no data_path; each
    document's loss is the HF model's own over its BOS and prefix."""
    from transformers import AutoModelForCausalLM

    lines = (corpus / "valid.txt").read_text().splitlines()
    texts = ["\n".join(lines[2:12]), "\n".join(lines[20:24]), "\n".join(lines[40:70])]
    source = tmp_path / "docs.jsonl"
    records = [{"text": t, "meta": {"i": i}} for i, t in enumerate(texts)]
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    args = [
        f"hf={hf_models['llama']}",
        f"eval.documents={source}",
        "eval.factors=[1,2,4]",
        "eval.precision=32-true",
        f"out_dir={out}",
        "wandb=false",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    tokenizer = tokenizer_for(corpus)
    model = AutoModelForCausalLM.from_pretrained(hf_models["llama"]).eval()
    docs = {}
    for i, text in enumerate(texts):
        read = "".join(line + "\n" for line in text.split("\n"))
        ids = tokenizer(read, add_special_tokens=False)["input_ids"]
        docs[f"line {i + 1}"] = [tokenizer.bos_token_id, *ids]
    assert [r["length"] for r in rows] == [CONTEXT, 2 * CONTEXT, 4 * CONTEXT]
    for row in rows:
        long_enough = [n for n, d in docs.items() if len(d) - 1 >= row["length"]]
        assert [n for n, _ in row["document_losses"]] == long_enough
        assert row["documents"] == len(long_enough) > 0
        for name, loss in row["document_losses"]:
            theirs = own_loss(model, docs[name], row["length"])
            assert loss == pytest.approx(theirs, rel=1e-4, abs=1e-5)
    header = (out / "extrapolation" / "extrapolation.csv").read_text().splitlines()[0]
    assert "documents" in header.split(",")


def test_a_documents_tokens_and_counts_are_those_of_the_stream(corpus):
    """A whole document has the tokens, words and bytes a corpus split gives the same lines
    (poslab's word and BPE tokenizers, a pretrained model's); a prefix cut mid-line carries
    the words it completes."""
    texts = ["héllo wörld n1\n  two  words here\n\nthe last line has no newline", "n3"]
    train = (corpus / "train.txt").read_text().splitlines()
    for kind, vocab in (("word", None), ("bpe", 300)):
        tokenizer = train_tokenizer(train, kind, vocab)
        for text, doc in zip(texts, encoder_of_run(tokenizer)(texts), strict=True):
            stream = encode_lines(tokenizer, text.split("\n"))
            assert doc.ids.tolist() == stream.ids.tolist()
            assert (doc.words.sum(), doc.bytes.sum()) == (stream.words.sum(), stream.bytes.sum())
            if kind == "word":  # a word per token: word-level perplexity is token perplexity
                assert set(doc.words.tolist()) == {1}
    hf = tokenizer_for(corpus)
    for text, doc in zip(texts, encoder_of_pretrained(hf)(texts), strict=True):
        stream = encode_text(hf, text.split("\n"))
        assert doc.ids.tolist() == stream.ids.tolist()
        assert (doc.words.sum(), doc.bytes.sum()) == (stream.words.sum(), stream.bytes.sum())
    # the prefix up to "wörld": two words, their bytes and the space between them
    doc = encoder_of_pretrained(hf)(texts[:1])[0]
    cut = next(n for n in range(1, len(doc) + 1) if hf.decode(doc.ids[:n]) == "héllo wörld")
    assert int(doc.words[:cut].sum()) == 2
    assert int(doc.bytes[:cut].sum()) == len("héllo wörld".encode())


def test_reading_stops_once_max_documents_reach_every_length(corpus, tmp_path):
    source = tmp_path / "many.txt"
    source.write_text("".join(words(n) + "\n" for n in [40, 10] * 100))  # 41, 11 tokens
    tokenizer = train_tokenizer((corpus / "train.txt").read_text().splitlines(), "word", None)
    encode, eos = encoder_of_run(tokenizer), tokenizer.token_to_id(EOS)
    docs = load_documents(str(source), 3, [8, 32], encode, eos)
    assert not docs.read_all and len(docs.tokens) < 200
    assert [docs.names[i] for i in docs.chosen(32)] == ["line 1", "line 3", "line 5"]
    assert [docs.names[i] for i in docs.chosen(8)] == ["line 1", "line 2", "line 3"]
    # eval.min_document_tokens = the longest length: the same documents at every length
    fixed = load_documents(str(source), 3, [8, 32], encode, eos, min_tokens=32)
    assert fixed.chosen(8) == fixed.chosen(32) == docs.chosen(32)
    every = load_documents(str(source), None, [8, 32], encode, eos)
    assert every.read_all and len(every.tokens) == 200
    split, starts = every.prefixes([0, 2], 8)
    assert starts == [0, 9] and split.ids[0] == split.ids[9] == eos
    assert np.array_equal(split.ids[1:9], every.tokens[0].ids[:8])
    with pytest.raises(ConfigError, match="no document has 64 tokens, the shortest eval length"):
        load_documents(str(source), None, [64, 128], encode, eos)
    with pytest.raises(ConfigError, match="no document has 64 tokens, eval.min_document_tokens"):
        load_documents(str(source), None, [8, 16], encode, eos, min_tokens=64)


def bad_sources(root: Path) -> dict[str, Path]:
    root.mkdir()
    (root / "empty").mkdir()
    (root / "no_text.jsonl").write_text('{"body": "n1 v1 ."}\n')
    (root / "not_json.jsonl").write_text('{"text": "n1 v1 ."}\nn2 v2 .\n')
    (root / "table.csv").write_text("text\nn1 v1 .\n")
    (root / "short.txt").write_text("n1 v1 .\nn2 v2 .\n")
    (root / "blank.txt").write_text("\n  \n")
    (root / "binary.txt").write_bytes(b"n1 \x00 v1\n")
    (root / "latin1.txt").write_bytes("n1 caf\xe9\n".encode("latin-1"))
    (root / "latin1_folder").mkdir()
    (root / "latin1_folder" / "doc.txt").write_bytes("n1 caf\xe9\n".encode("latin-1"))
    (root / "list.jsonl").write_text('["n1 v1 ."]\n')
    return {p.name: p for p in root.iterdir()}


BAD = [
    ("documents={root}/missing", "eval.documents={root}/missing does not exist"),
    ("documents={root}/empty", "holds no .txt file"),
    ("documents={root}/no_text.jsonl", "line 1 has no \"text\" string (its fields are ['body'])"),
    ("documents={root}/not_json.jsonl", "line 2 is not JSON"),
    ("documents={root}/table.csv", "is neither a folder nor a .txt or .jsonl file"),
    ("documents={root}/short.txt", "no document has 16 tokens, the shortest eval length"),
    ("documents={root}/blank.txt", "holds no document with text"),
    ("documents={root}/binary.txt", "line 1 of binary.txt holds a NUL byte"),
    ("documents={root}/latin1.txt", "latin1.txt is not UTF-8 text"),
    ("documents={root}/latin1_folder", "doc.txt is not UTF-8 text (invalid continuation byte"),
    ("documents={root}/list.jsonl", 'line 1 has no "text" string (a list)'),
    ("max_documents=3", "eval.max_documents=3 chooses among eval.documents, which is not set"),
    ("min_document_tokens=64", "eval.min_document_tokens=64 chooses among eval.documents"),
    ("max_documents=0", "eval.max_documents=0"),
]


@pytest.mark.parametrize(("setting", "expected"), BAD, ids=[s for s, _ in BAD])
def test_a_bad_documents_setting_is_one_line(rope, tmp_path, monkeypatch, capfd, setting, expected):
    root = tmp_path / "sources"
    bad_sources(root)
    out = tmp_path / "out"
    args = [f"run={rope}", f"eval.{setting.format(root=root)}", f"out_dir={out}", "wandb=false"]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert not contract_problems(result, expected.format(root=root), out), result.stderr


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("eval.modes=[nonoverlapping,sliding]", "eval.modes=[nonoverlapping,sliding] with"),
        ("eval.max_tokens=500", "eval.max_tokens=500 caps a corpus split"),
    ],
)
def test_options_documents_replace_are_refused(
    hf_models, tmp_path, monkeypatch, capfd, extra, expected
):
    """Before the model loads (hf=): sliding windows and a token cap have no meaning here."""
    source = tmp_path / "docs.txt"
    source.write_text(words(50) + "\n")
    out = tmp_path / "out"
    args = [f"hf={hf_models['llama']}", f"eval.documents={source}", extra, f"out_dir={out}"]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert not contract_problems(result, expected, out), result.stderr


def test_a_task_checkpoint_refuses_documents(task_run, tmp_path, monkeypatch, capfd):
    """A passkey run is scored on fresh examples: documents would be ignored, so one line."""
    source = tmp_path / "docs.txt"
    source.write_text(words(50) + "\n")
    out = tmp_path / "out"
    args = [f"run={task_run}", f"eval.documents={source}", f"out_dir={out}", "wandb=false"]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert not contract_problems(result, "was trained on a generated task", out), result.stderr
    assert f"eval.documents={source}" in result.stderr


def test_a_training_run_evaluates_its_documents_after_training(corpus, tmp_path):
    """train.py eval.documents=PATH: the evaluation after training reads the documents with
    the run's tokenizer; a bad setting fails before training."""
    from conftest import train_in_process

    source = tmp_path / "docs.txt"
    source.write_text("".join(words(n) + "\n" for n in (70, 20)))
    short = ["trainer.max_steps=4", "trainer.val_check_interval=2", "eval.max_tokens=auto"]
    documents = [f"eval.documents={source}", "eval.modes=[nonoverlapping]", *short]
    train_in_process("alibi", corpus, tmp_path / "run", documents)
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert [(r["length"], r["documents"]) for r in rows] == [(16, 2), (32, 1), (64, 1)]
    with pytest.raises(ConfigError, match="eval.modes=\\[nonoverlapping,sliding\\] with"):
        train_in_process("alibi", corpus, tmp_path / "refused", [f"eval.documents={source}"])
    assert not (tmp_path / "refused" / "checkpoints").exists()


def test_a_length_the_scheme_cannot_represent_scores_no_document(trained_runs, tmp_path):
    """Learned positions past their table: skipped as for a stream (0 documents scored), and
    the legend tells it from a length no document reaches."""
    folder = documents_folder(tmp_path / "docs")
    ckpt = trained_runs["learned"][0] / "checkpoints" / "best.ckpt"
    cfg = eval_cfg(documents=str(folder), max_tokens=None, factors=[1, 2, 8], unsupported="skip")
    rows = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "out")
    assert [(r["length"], r["documents"]) for r in rows] == [(16, 3), (32, 0), (128, 0)]
    assert "beyond the table" in rows[1]["status"]
    assert "beyond the table" in rows[2]["status"]  # said first, though no document has 128
    md = (tmp_path / "out" / "extrapolation" / "extrapolation.md").read_text()
    assert "a length the scheme cannot represent" in md
    assert "no document reaches" not in md
