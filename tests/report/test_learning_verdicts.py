"""Learned at L with the examples' uncertainty (report/learning.py): each seed's Wilson interval
against the line gives "learned", "unclear" or "not learned"; the learning table shows them, the
verdict counts and each seed's sure–possible effective length, and ranks only surely learned
rows."""

from __future__ import annotations

import pytest

from poslab.report.intervals import wilson_interval
from poslab.report.learning import (
    UNCLEAR,
    VERDICT_NO,
    VERDICT_YES,
    effective_lengths,
    judged,
    seed_accuracies,
)
from poslab.report.seeds import merge_seeds
from poslab.report.tables import learning_table, markdown

LINE = 0.9


@pytest.mark.parametrize(
    ("accuracy", "verdict"),
    [
        (0.908, UNCLEAR),
        (0.900, UNCLEAR),
        (0.99, VERDICT_YES),
        (0.5, VERDICT_NO),
        (0.86, VERDICT_NO),
    ],
)
def test_a_seeds_verdict_is_where_its_wilson_interval_lies_against_the_line(accuracy, verdict):
    seed = judged(accuracy, 250, LINE)
    assert seed.verdict == verdict
    assert (seed.low, seed.high) == wilson_interval(accuracy * 250, 250)
    # what each verdict means, in the bounds themselves
    assert (seed.low >= LINE) == (verdict == VERDICT_YES)
    assert (seed.high < LINE) == (verdict == VERDICT_NO)


def test_more_examples_settle_an_accuracy_just_above_the_line():
    assert judged(0.908, 250, LINE).verdict == UNCLEAR
    assert judged(0.908, 20_000, LINE).verdict == VERDICT_YES  # the interval narrows past the line
    assert judged(0.908, None, LINE).verdict is None  # no count: nothing to judge by


def seed_rows(accuracies, seed_examples=250, scheme="kerple", train_length=64):
    """One seed's rows of a needle run, one per length (L, 2L, 4L, ...)."""
    rows = []
    for i, a in enumerate(accuracies):
        length = train_length * 2**i
        rows.append(
            {
                "scheme": scheme,
                "mode": "needle",
                "task": "needle",
                "split": "generated",
                "train_length": train_length,
                "length": length,
                "factor": length / train_length,
                "status": "ok",
                "accuracy": a,
                "token_accuracy": a,
                "ppl": 1.0,
                "loss": 0.0,
                "examples": seed_examples,
                "learned_at": LINE,
                "learned": accuracies[0] >= LINE,
                "effective_length": 0,
                "steps_to_learn": None,
            }
        )
    return rows


def merged(scheme, per_seed):
    return merge_seeds(
        [(s + 1, seed_rows(a, scheme=scheme)) for s, a in enumerate(per_seed)], scheme
    )


def test_effective_lengths_per_seed_are_sure_and_possible():
    rows = merged(
        "kerple",
        [
            [0.99, 0.99, 0.908, 0.5],  # learned, learned, unclear, not learned
            [0.908, 0.99, 0.99, 0.99],  # unclear at L: surely learned nowhere
            [0.5, 0.99, 0.99, 0.99],  # not learned at L: 0 either way
        ],
    )
    spans = effective_lengths({r["length"]: r for r in rows}, 64, LINE)
    assert spans == {"1": (128, 256), "2": (0, 512), "3": (0, 0)}


def test_the_learning_table_shows_each_seed_its_verdict_counts_and_ranks_only_sure_rows():
    rows = merged("kerple", [[0.908, 0.95], [0.99, 0.99], [0.96, 0.5]]) + merged(
        "alibi", [[0.99, 0.97], [0.98, 0.6], [1.0, 0.99]]
    )
    table = learning_table(rows, "scheme")
    lines = {line.split(" | ")[0]: line for line in table.splitlines()[2:]}
    kerple, alibi = lines["| kerple"], lines["| alibi"]
    # every seed reached 0.9, but 0.908 of 250 is unclear: kerple is not ranked
    assert kerple.startswith("| kerple | 3/3 | 0.908 [0.866, 0.938] ?; 0.990 [")
    assert "| learned 2, unclear 1, not learned 0 of 3 |" in kerple
    assert "| 0–128; 128; 64 |" in kerple  # seed 3 drops to 0.5 at 128: surely not learned
    assert kerple.endswith("| — |")
    assert "| learned 3, unclear 0, not learned 0 of 3 |" in alibi
    assert alibi.endswith("| 1 |")
    # the pooled Wilson interval stays in the accuracy table
    text = markdown(rows, "needle: accuracy vs evaluation length", "scheme")
    pooled = wilson_interval((0.908 + 0.99 + 0.96) / 3 * 750, 750)
    assert f"[{pooled[0]:.2f}, {pooled[1]:.2f}]" in text.split("### accuracy")[1]
    assert "unclear (?) when the interval holds 0.9" in text


def test_a_one_seed_row_is_judged_by_its_own_accuracy_and_examples():
    (row,) = seed_rows([0.908])
    assert {k: v.verdict for k, v in seed_accuracies(row, LINE).items()} == {"": UNCLEAR}
    pooled_only = {**row, "examples": None, "examples_pooled": 20_000}
    assert seed_accuracies(pooled_only, LINE)[""].verdict == VERDICT_YES
    table = learning_table(seed_rows([0.99, 0.95]), "scheme")
    assert (
        "| kerple | yes | 0.990 [0.968, 0.997] ✓ | learned 1, unclear 0, not learned 0 of 1 |"
        in table
    )
    # a merged row that kept no per-seed values cannot say which seed is which: no verdict
    assert seed_accuracies({**row, "n_seeds": 3}, LINE) == {}


def test_a_table_without_a_learning_threshold_judges_each_row_on_its_pooled_examples():
    from poslab.report.tables import task_tables

    def row(scheme: str, accuracy: float) -> dict:
        return {
            "scheme": scheme,
            "task": "passkey",
            "mode": "passkey",
            "status": "ok",
            "length": 64,
            "factor": 1.0,
            "train_length": 64,
            "accuracy": accuracy,
            "token_accuracy": accuracy,
            "ppl": 1.5,
            "examples": 100,
            "n_seeds": 3,
        }

    text = "\n".join(task_tables([row("a", 0.99), row("b", 0.91), row("c", 0.2)], "p", "scheme"))
    assert "judged by the interval" in text
    assert "| a | 3 | 0.990 [0.971, 0.997] ✓ | learned |" in text  # 297 of 300 pooled
    assert "| b | 3 |" in text and "| unclear |" in text
    assert "| c | 3 |" in text and "| not learned |" in text


def test_seeds_scored_on_different_example_counts_get_their_own_intervals():
    # one seed scored again on 1,250 examples (eval.py eval.task_examples=250), one on 250
    rows = merge_seeds(
        [(1, seed_rows([0.105], seed_examples=1250)), (2, seed_rows([0.004], seed_examples=250))],
        "cable",
    )
    found = seed_accuracies(rows[0], LINE)
    for seed, accuracy, examples in (("1", 0.105, 1250), ("2", 0.004, 250)):
        expected = wilson_interval(accuracy * examples, examples)
        assert (found[seed].low, found[seed].high) == pytest.approx(expected)


def test_the_legend_note_counts_seeds_by_their_wilson_verdict():
    from poslab.report.tables import learning_note

    row = {
        "length": 64,
        "train_length": 64,
        "status": "ok",
        "learned": False,
        "n_seeds": 3,
        "learned_seeds": 2,  # by the plain threshold: 0.912 and 0.908 reach 0.9
        "learned_at": 0.9,
        "examples": 250,
        "per_seed": {"accuracy": {"1": 0.912, "2": 0.908, "3": 0.80}},
    }
    # on 250 examples none of the three is surely above 0.9: two unclear, one below
    assert learning_note(row) == "learned at L in 0/3 seeds, 2 unclear"
    sure = {**row, "per_seed": {"accuracy": {"1": 0.99, "2": 0.99, "3": 0.5}}}
    assert learning_note(sure) == "learned at L in 2/3 seeds"
    beyond = {**row, "length": 128}  # not at L: the plain count, as before
    assert learning_note(beyond) == "learned at L in 2/3 seeds"
