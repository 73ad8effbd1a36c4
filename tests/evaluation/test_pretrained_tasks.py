"""eval.py hf=MODEL data=<task> (poslab/evaluation/pretrained_tasks.py): poslab's generated tasks
rendered as text for a pretrained HF causal LM, in its own tokens.

Tiny random models and their byte-level BPE tokenizer (tests/hf_models.py) are loaded from
save_pretrained folders. Checked: the answer tokens decode back to the answer; an example never
takes more tokens than the evaluation length, and one more task word would not fit; the scores
equal those of the model's own logits, example by example; the command writes the task reports;
a task the model cannot be given is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import CONF, contract_problems, eval_cfg, run_in_process
from hf_models import CONTEXT, hf_model
from hydra.utils import instantiate
from omegaconf import OmegaConf

from poslab.evaluation.plan import plan_pretrained
from poslab.evaluation.pretrained_tasks import (
    TASK_SEED,
    evaluate_pretrained_task,
    fitted,
    rendered_batches,
    tokenize,
)
from poslab.tasks import EVALUATION
from poslab.tasks.base import example_rng

# the tasks of one position per token, each at a length its shortest example fits in (tokens
# of the test tokenizer: its words are spelled out in a few characters each)
TASKS = ("needle", "passkey", "copy", "reverse", "multi_key", "variable_tracking")
LENGTH = 512
START = 0  # <s>, the tiny tokenizer's BOS


def data_config(name: str):  # -> DictConfig
    return OmegaConf.load(CONF / "data" / f"{name}.yaml")


@pytest.fixture(scope="module")
def tokenizer(hf_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_models["llama"])


def rendered_examples(task, tokenizer, length: int, count: int) -> list:
    """`count` examples fitted at `length` (condition by turns), with the maker of each."""
    out = []
    for i in range(count):
        condition = task.conditions()[i % len(task.conditions())]

        def make(n: int, i: int = i, condition: dict = condition):
            return task.example(n, example_rng(TASK_SEED, EVALUATION, length, i), condition)

        out.append((fitted(task, length, make, tokenizer, START), make))
    return out


@pytest.mark.parametrize("name", TASKS)
def test_the_answer_tokens_decode_back_to_the_answer(name, tokenizer):
    task = instantiate(data_config(name).task)
    for rendered, _ in rendered_examples(task, tokenizer, LENGTH, 6):
        answer_words = task.decode(rendered.example.answer_tokens)
        ids = rendered.ids
        assert ids[0] == START and rendered.answer.shape == (len(ids) - 1,)
        # the targets marked as the answer are the answer, spaces between its words included
        assert tokenizer.decode(ids[1:][rendered.answer]).strip() == answer_words
        # and the text is the example's words: nothing but the answer's tokens is marked
        assert tokenizer.decode(ids[1:]) == rendered.text
        words = task.decode(rendered.example.tokens).split()
        assert rendered.text.split() == [w for w in words if w != "<pad>"]
        first = int(np.flatnonzero(rendered.answer)[0])
        last = int(np.flatnonzero(rendered.answer)[-1])
        assert rendered.answer[first : last + 1].all()  # one run of tokens


@pytest.mark.parametrize("name", TASKS)
def test_an_example_fills_the_length_in_model_tokens_and_never_exceeds_it(name, tokenizer):
    task = instantiate(data_config(name).task)
    # the most tokens one more word can add (a word and its space)
    word = max(len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) for w in task.tokens)
    for length in (LENGTH, 2 * LENGTH):
        for rendered, make in rendered_examples(task, tokenizer, length, 4):
            read = len(rendered.ids) - 1  # the model reads all but the last token
            assert read <= length
            n = len(rendered.example.tokens) - 1  # the task length the search chose
            longer = make(n + 1)
            text = " ".join(w for w in task.decode(longer.tokens).split() if w != "<pad>")
            ids, _ = tokenize(tokenizer, text, [], START)
            assert len(ids) - 1 > length  # one word more would not fit
            assert length - read < word  # closer than one more word


def steered_llama(folder, tokenizer, vocab: int, picks: tuple[int, int]):
    """A tiny llama whose argmax is picks[0] or picks[1] by the sign of one hidden unit: right
    at some answer tokens and wrong at others, so agreement of the scores is not vacuous."""
    model = hf_model("llama", vocab)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[picks[0], 0] = 1.0
        model.lm_head.weight[picks[1], 0] = -1.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_the_scores_are_the_models_own_argmax_example_by_example(tokenizer, tmp_path):
    data = OmegaConf.create({"name": "copy", "task": {"_target_": "poslab.tasks.copy.Copy"}})
    data.task.symbols = 2  # answers of a and b
    picks = tuple(tokenizer(" a b", add_special_tokens=False)["input_ids"][i] for i in (0, -1))
    model = steered_llama(tmp_path / "steered", tokenizer, len(tokenizer), picks)
    lengths = [CONTEXT // 2, CONTEXT]
    # fp32 as the reference below: under `auto` a CPU with native bf16 scores in bf16, where the
    # steering unit's sign (so the argmax) can flip on an example
    cfg = eval_cfg(
        max_tokens=None, lengths=lengths, task_examples=6, device="cpu", precision="32-true"
    )
    plan = plan_pretrained(str(tmp_path / "steered"), None, cfg, wandb=False)
    rows, _ = evaluate_pretrained_task(plan, instantiate(data.task), data)
    seen = []
    for row in rows:
        exact, right, total, nll = [], 0, 0, 0.0
        for _, made in rendered_batches(plan, row["length"]):
            for r in made:
                with torch.inference_mode():
                    logits = model(input_ids=torch.from_numpy(r.ids[None, :-1])).logits[0]
                targets = torch.from_numpy(r.ids[1:])[torch.from_numpy(r.answer)]
                scored = logits[torch.from_numpy(r.answer)]
                hits = scored.argmax(-1) == targets
                exact.append(bool(hits.all()))
                right, total = right + int(hits.sum()), total + len(targets)
                nll += float(torch.nn.functional.cross_entropy(scored, targets, reduction="sum"))
        assert row["accuracy"] == pytest.approx(np.mean(exact))
        assert row["token_accuracy"] == pytest.approx(right / total)
        assert row["loss"] == pytest.approx(nll / total, rel=1e-5)
        assert row["tokens"] == total
        seen.append(right / total)
    assert min(seen) > 0 and max(seen) < 1  # the steered model is right only sometimes


def test_eval_py_scores_a_pretrained_model_on_a_task_and_writes_the_reports(
    hf_models, tmp_path, monkeypatch, capfd
):
    lengths = [4 * CONTEXT, 8 * CONTEXT]  # the needle's shortest example takes 98 tokens here
    args = [
        f"hf={hf_models['llama']}",
        "data=needle",
        f"eval.lengths=[{lengths[0]},{lengths[1]}]",
        "eval.task_examples=3",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    folder = tmp_path / "outputs" / "pretrained" / "llama"
    reports = folder / "extrapolation"
    names = {p.name for p in reports.iterdir()}
    assert {"extrapolation.json", "extrapolation.csv", "extrapolation.md"} <= names
    assert {"extrapolation_accuracy.png", "extrapolation_heatmap.png"} <= names
    rows = json.loads((reports / "extrapolation.json").read_text())
    assert [r["length"] for r in rows] == lengths
    assert [r["factor"] for r in rows] == [4.0, 8.0]  # multiples of the model's context
    for row in rows:
        assert row["status"] == "ok" and row["task"] == "needle" and row["examples"] == 15
        assert row["example_tokens_max"] <= row["length"]
        assert row["example_tokens_min"] >= row["length"] - 10
        assert 0 <= row["accuracy"] <= 1 and row["chance"] > 0 and row["shortcut"] is not None
        depths = [c["condition"]["depth"] for c in row["by_condition"]]
        assert depths == [0.0, 0.25, 0.5, 0.75, 1.0]
    table = (reports / "extrapolation.md").read_text()
    assert "| _chance_ |" in table and "| _best shortcut_ |" in table
    assert "example_tokens_mean" in (reports / "extrapolation.csv").read_text().splitlines()[0]
    assert list((folder / "wandb").glob("offline-run-*"))  # W&B (offline in tests)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["data=grid"], "cannot be given; with hf= use data=assoc_recall|copy|multi_key"),
        (["data=wikitext2"], "data=wikitext2 is a corpus, not a generated task"),
        (["data=needle", "eval.lengths=[64]"], "eval length 64 is too short for the needle"),
    ],
)
def test_a_task_the_model_cannot_be_given_is_one_line(
    args, expected, hf_models, tmp_path, monkeypatch, capfd
):
    out = tmp_path / "out"
    command = [f"hf={hf_models['llama']}", *args, f"out_dir={out}", "wandb=false"]
    result = run_in_process("eval", command, tmp_path, monkeypatch, capfd)
    assert not contract_problems(result, expected, out), result.stderr
