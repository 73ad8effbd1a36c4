"""Every task states its trivial heuristics (poslab.tasks.base.Task.shortcuts) and an oracle: on
evaluation examples at 1-4x a training length, the oracle scores 1 and every shortcut at most
the task's stated margin, unless the task is marked shortcut-prone (passkey: the test shows the
shortcut solves it). grid's best shortcut is the copy-one-offset heuristic, not chance."""

from __future__ import annotations

import numpy as np
import pytest

from poslab.tasks import EVALUATION, TaskExamples
from poslab.tasks.assoc_recall import AssocRecall
from poslab.tasks.base import best_shortcut, predictor_accuracy
from poslab.tasks.copy import Copy
from poslab.tasks.grid import Grid
from poslab.tasks.multi_key import MultiKey
from poslab.tasks.multi_query import MultiQuery
from poslab.tasks.multi_value import MultiValue
from poslab.tasks.needle import Needle
from poslab.tasks.passkey import Passkey
from poslab.tasks.reverse import Reverse
from poslab.tasks.variable_tracking import VariableTracking

TASKS = {
    "needle": Needle,
    "multi_key": MultiKey,
    "multi_value": MultiValue,
    "multi_query": MultiQuery,
    "variable_tracking": VariableTracking,
    "copy": Copy,
    "reverse": Reverse,
    "assoc_recall": AssocRecall,
    "grid": Grid,
    "passkey": Passkey,
}
EXAMPLES = 480  # per length: a shortcut at its margin + 0.05 is > 5 standard errors away


def evaluation_examples(task, length):
    """What the evaluation scores: EXAMPLES fresh examples spread over the task's conditions."""
    conditions = task.conditions()
    per = EXAMPLES // len(conditions)
    batch = []
    for c, condition in enumerate(conditions):
        made = TaskExamples(task, length, per, 7, EVALUATION, condition=condition)
        batch += [made.example(c * per + i) for i in range(per)]
    return batch


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("length", [64, 256])
def test_the_oracle_scores_1_reading_only_the_input(name, length):
    task = TASKS[name]()
    assert predictor_accuracy(evaluation_examples(task, length), task.oracle) == (1.0, 1.0)


@pytest.mark.parametrize("name", [n for n in TASKS if not TASKS[n].shortcut_prone])
@pytest.mark.parametrize("length", [64, 256])
def test_every_stated_shortcut_scores_at_most_the_stated_margin(name, length):
    task = TASKS[name]()
    shortcuts = task.shortcuts()
    assert shortcuts, f"{name} states no shortcut"
    batch = evaluation_examples(task, length)
    for shortcut, predict in shortcuts.items():
        exact, _ = predictor_accuracy(batch, predict)
        assert exact <= task.shortcut_margin, f"{name}: {shortcut!r} scores {exact:.2f}"


def test_the_needle_falls_only_to_index_guesses_and_they_fade_with_length():
    task = Needle()
    index_guesses = {n for n in task.shortcuts() if n.startswith(("the second", "the third"))}
    for length, bound in ((128, 0.2), (512, 0.2)):
        batch = evaluation_examples(task, length)
        for name, predict in task.shortcuts().items():
            exact, _ = predictor_accuracy(batch, predict)
            # number-shaped heuristics (last, first, most frequent, longest, the tokens before
            # the question) stay near chance; guessing by index is bounded by the numbers' count
            assert exact <= (bound if name in index_guesses else 0.05), (length, name, exact)


@pytest.mark.parametrize("name", ["multi_value", "copy", "reverse", "assoc_recall"])
def test_the_needle_and_algorithmic_tasks_have_shortcuts_near_chance(name):
    # not only below a margin: no heuristic gets a whole answer right more than 5% of the time
    task = TASKS[name]()
    best = best_shortcut(task, evaluation_examples(task, 128))
    assert best["accuracy"] <= 0.05, best


@pytest.mark.parametrize("name", ["multi_key", "multi_query", "variable_tracking"])
def test_choosing_among_needles_scores_one_over_the_arrangements_and_no_more(name):
    # a model that finds the needles but does not bind keys: the margin names this baseline
    task = TASKS[name]()
    best = best_shortcut(task, evaluation_examples(task, 128))
    chance_among_needles = task.shortcut_margin - 0.05
    assert abs(best["accuracy"] - chance_among_needles) < 4 * np.sqrt(
        chance_among_needles * (1 - chance_among_needles) / EXAMPLES
    ), best


def test_passkey_is_marked_shortcut_prone_and_its_shortcut_solves_it():
    task = Passkey()
    assert task.shortcut_prone
    best = best_shortcut(task, evaluation_examples(task, 512))
    assert best["accuracy"] == 1.0  # copying the digits: why data=needle replaces it


def test_grid_best_shortcut_is_copying_one_offset_not_chance():
    task = Grid()
    best = best_shortcut(task, evaluation_examples(task, 64))
    n, colors = len(set(task.shifts)), len(task.answer_symbols())
    per_cell = 1 / n + (1 - 1 / n) / colors  # right for the grids of that shift, chance elsewhere
    # (the best of three offsets on one sample, and shift-0 grids have more answer cells: above)
    assert per_cell - 0.05 < best["token_accuracy"] < per_cell + 0.1, best
    assert best["token_accuracy"] > 2 * task.chance(evaluation_examples(task, 64)[0])[1]


def test_the_shortcuts_read_no_answer_token():
    # a shortcut given an example whose answer was scrambled guesses the same
    task = Needle()
    for example in evaluation_examples(task, 64)[:40]:
        scrambled = example.tokens.copy()
        scrambled[-len(example.answer_tokens) :] = scrambled[-1]
        twin = type(example)(scrambled, example.answer, example.condition)
        for predict in task.shortcuts().values():
            assert np.array_equal(predict(example), predict(twin))
