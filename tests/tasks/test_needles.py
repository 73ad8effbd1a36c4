"""The needle tasks of the RULER family (poslab/tasks/haystack.py and one module each): exact
lengths, answers where the prompt states them, distractor numbers that are never the key, keys
of variable length, bad options as one line, and a real training run of each that reports the
baselines, learned-at-L and the effective length."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import compose_train

from poslab.errors import ConfigError
from poslab.tasks import example_rng
from poslab.tasks.haystack import numbers_in
from poslab.tasks.multi_key import MultiKey
from poslab.tasks.multi_query import MultiQuery
from poslab.tasks.multi_value import MultiValue
from poslab.tasks.needle import Needle
from poslab.tasks.variable_tracking import VariableTracking

NEEDLES = {
    "needle": Needle,
    "multi_key": MultiKey,
    "multi_value": MultiValue,
    "multi_query": MultiQuery,
    "variable_tracking": VariableTracking,
}


def make(task, length, n, train=False, condition=None, seed=0):
    return [task.example(length, example_rng(seed, 3, i), condition, train) for i in range(n)]


@pytest.mark.parametrize("name", NEEDLES)
@pytest.mark.parametrize("train", [False, True])
def test_examples_have_the_length_and_are_a_function_of_the_seed(name, train):
    task = NEEDLES[name]()
    for length in (task.min_length(), 64, 200):
        batch = make(task, length, 30, train)
        assert all(len(e.tokens) == length + 1 and len(e.answer) == length for e in batch)
        again = make(task, length, 30, train)
        assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(batch, again, strict=True))
        assert all(e.answer.sum() >= 2 for e in batch)  # a value (or variable) and its full stop
        if not train:  # evaluation examples fill the length; training ones may be shorter
            assert all(e.answer[-1] and e.tokens[-1] != 0 for e in batch)


def test_training_haystacks_vary_in_size_and_are_padded_after_the_answer():
    task = Needle()
    batch = make(Needle(), 128, 50, train=True)
    sizes = {int(np.flatnonzero(e.answer)[-1]) for e in batch}
    assert len(sizes) > 10 and max(sizes) <= 127 and min(sizes) >= task.min_length() - 1
    for e in batch:
        end = int(np.flatnonzero(e.answer)[-1]) + 2
        assert (e.tokens[end:] == 0).all()


def test_the_needle_key_is_stated_at_its_depth_among_other_numbers():
    task = Needle()
    for depth in (0.0, 0.5, 1.0):
        for e in make(task, 128, 40, condition={"depth": depth}):
            prompt = e.prompt
            numbers = task.context_numbers(prompt)
            key = e.answer_tokens[:-1]
            where = [i for i, n in enumerate(numbers) if np.array_equal(n, key)]
            assert len(where) == 1  # the key appears once; no distractor equals it
            assert 0 < where[0] < len(numbers) - 1  # never the first nor the last number
            if depth == 0.0:
                assert where[0] in (1, 2)  # right after the one or two opening number sentences
            if depth == 1.0:
                assert where[0] in (len(numbers) - 2, len(numbers) - 3)  # one or two follow
            # every number has the key's length: length does not single it out
            assert all(len(n) == len(key) for n in numbers[1:-1])


def test_keys_have_every_length_between_min_and_max_digits():
    task = Needle(min_digits=1, max_digits=5)
    lengths = {len(e.answer_tokens) - 1 for e in make(task, 96, 200)}
    assert lengths == {1, 2, 3, 4, 5}


def test_multi_query_answers_the_asked_keys_in_the_order_asked():
    task = MultiQuery(keys=4, queries=3)
    for e in make(task, 96, 30):
        prompt = e.prompt
        start = task.question_start(prompt) + 3
        asked = prompt[start : start + 3].tolist()
        values = dict(task.needle_values(prompt))
        expected = task.answer_of([values[k] for k in asked])
        assert np.array_equal(e.answer_tokens, expected)


def test_variable_tracking_answers_the_chain_of_the_asked_number():
    task = VariableTracking(chains=3, hops=2)
    for e in make(task, 128, 30):
        chains = task.chains_of(e.prompt)
        assert len(chains) == 3 and all(len(c) == 3 for c in chains)
        assert e.answer_tokens[:-1].tolist() in chains
        asked = numbers_in(e.prompt[task.question_start(e.prompt) :], task.digit_set)[0]
        first = [v for v, n in task.assignments(e.prompt) if n == tuple(asked.tolist())]
        assert first == [e.answer_tokens[0]]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Needle(min_digits=3, max_digits=2), "max_digits=2 is below"),
        (lambda: Needle(min_digits=0), "min_digits=0"),
        (lambda: MultiKey(keys=5, names=3), "data.task.names=3"),
        (lambda: MultiQuery(keys=2, queries=3), "queries=3 is more than data.task.keys=2"),
        (lambda: VariableTracking(chains=0), "data.task.chains=0"),
        (lambda: MultiValue(values=True), "data.task.values=true"),
        (lambda: Needle().example(20, example_rng(0, 0)), "too short for the needle task"),
    ],
)
def test_bad_needle_options_are_one_line(build, message):
    with pytest.raises(ConfigError, match=message) as err:
        build()
    assert "\n" not in str(err.value)


TINY = [
    "model=tiny",
    "model.n_layer=1",
    "data.batch_size=8",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "data.val_examples=16",
    "eval.factors=[1,2]",
    "eval.task_examples=8",
    "logger=none",
]


@pytest.mark.parametrize("name", NEEDLES)
def test_training_on_a_needle_task_reports_baselines_learned_at_l_and_effective_length(
    name, tmp_path
):
    from poslab.run.training import run_training

    out = tmp_path / name
    run_training(compose_train([f"data={name}", "pos=rope", *TINY], out))
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    assert [r["length"] for r in rows] == [64, 128]
    for r in rows:
        assert r["status"] == "ok" and r["learned_at"] == 0.9
        assert r["learned"] is (rows[0]["accuracy"] >= 0.9)
        assert r["effective_length"] in (0, 64, 128)
        assert r["shortcut_name"] in NEEDLES[name]().shortcuts()
        assert 0 <= r["shortcut"] <= 1 and 0 <= r["chance"] < 0.05
    text = (out / "extrapolation" / "extrapolation.md").read_text()
    assert "### learned at L, effective length" in text
    assert "| _chance_ |" in text and "| _best shortcut_ |" in text
