"""Learned at L, effective length (RULER) and steps to learn: on made-up rows, merged over
seeds, in the tables (a run that did not learn is labelled and never ranked), and from a real
training run that stops at a validation accuracy (train.stop_at_accuracy)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose_train

from poslab.evaluation.tasks import learning_summary
from poslab.report.seeds import merge_seeds
from poslab.report.tables import learning_table, markdown


def rows_of(accuracies, train_length=64, scheme="rope", **extra):
    return [
        {
            "scheme": scheme,
            "mode": "needle",
            "task": "needle",
            "split": "generated",
            "train_length": train_length,
            "length": train_length * 2**i,
            "status": "ok" if a is not None else "skipped: beyond the table",
            "accuracy": a,
            "token_accuracy": a,
            "ppl": 1.0,
            "loss": 0.0,
            "chance": 0.001,
            "token_chance": 0.4,
            "shortcut": 0.02,
            "shortcut_token": 0.3,
            "shortcut_name": "the last number",
            **extra,
        }
        for i, a in enumerate(accuracies)
    ]


@pytest.mark.parametrize(
    ("accuracies", "learned", "effective"),
    [
        ([0.95, 0.92, 0.91, 0.95], True, 512),  # every length at or above the threshold
        ([0.95, 0.92, 0.5, 0.95], True, 128),  # "stays": the first drop ends it
        ([0.9, 0.2, 0.95, 0.95], True, 64),  # the threshold itself counts
        ([0.89, 0.95, 0.95, 0.95], False, 0),  # not learned at L: no effective length
        ([0.95, None, 0.95, 0.95], True, 64),  # a skipped length is not a length it holds
    ],
)
def test_effective_length_is_the_longest_length_up_to_which_accuracy_stays_above(
    accuracies, learned, effective
):
    summary = learning_summary(rows_of(accuracies), 64, 0.9)
    assert summary == {"learned_at": 0.9, "learned": learned, "effective_length": effective}


def test_learned_is_unknown_when_the_training_length_was_not_evaluated():
    rows = rows_of([0.95, 0.95])[1:]  # only 128
    assert learning_summary(rows, 64, 0.9)["learned"] is None


def with_summary(rows, threshold=0.9, steps=None):
    summary = learning_summary(rows, rows[0]["train_length"], threshold)
    return [{**r, **summary, "steps_to_learn": steps} for r in rows]


def test_a_run_that_did_not_learn_gets_no_rank_and_says_so():
    rows = (
        with_summary(rows_of([0.95, 0.5, 0.1], scheme="alibi"), steps=250)
        + with_summary(rows_of([0.95, 0.95, 0.2], scheme="rope"), steps=500)
        + with_summary(rows_of([0.99, 0.99, 0.99], scheme="nope"), steps=750)
        + with_summary(rows_of([0.3, 0.99, 0.99], scheme="t5"))  # high beyond L, but unlearned
    )
    table = learning_table(rows, "scheme")
    lines = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    # no example count in these rows: no interval, no verdict ("—"); ranked by accuracy alone
    assert lines["nope"].endswith("| 256 | — | 750 | 1 |")
    assert lines["rope"].endswith("| 128 | — | 500 | 2 |")
    assert lines["alibi"].endswith("| 64 | — | 250 | 3 |")
    assert lines["t5"].endswith("| no | 0.300 | — | 0 | — | — | — |")
    text = markdown(rows, "needle: accuracy vs evaluation length", "scheme")
    assert "| t5 (did not learn at L) |" in text
    assert "| _chance_ |" in text and "| _best shortcut_ | 0.02 |" in text
    assert "the last number" in text


def test_ties_in_effective_length_share_a_rank():
    rows = with_summary(rows_of([0.95, 0.95], scheme="a")) + with_summary(
        rows_of([0.97, 0.91], scheme="b")
    )
    ranks = [
        line.rsplit("|", 2)[1].strip() for line in learning_table(rows, "scheme").splitlines()[2:]
    ]
    assert ranks == ["1", "1"]


def test_seeds_merge_into_learned_seeds_and_effective_length_mean_sd():
    runs = [
        (1, with_summary(rows_of([0.95, 0.95, 0.95]), steps=250)),
        (2, with_summary(rows_of([0.95, 0.95, 0.5]), steps=750)),
        (3, with_summary(rows_of([0.5, 0.5, 0.5]))),
    ]
    merged = merge_seeds(runs, "rope")
    row = merged[0]
    assert row["learned"] is False and row["learned_seeds"] == 2 and row["n_seeds"] == 3
    assert row["effective_length"] == pytest.approx((256 + 128 + 0) / 3)
    assert row["effective_length_sd"] == pytest.approx(128.0)
    assert row["steps_to_learn"] == 500 and row["steps_learned"] == 2
    assert row["shortcut"] == pytest.approx(0.02)
    table = learning_table(merged, "scheme")
    assert "| rope | 2/3 | 0.950; 0.950; 0.500 | — | 128 ± 128 | — | 500 ± 354 | — |" in table


def test_a_row_some_seeds_of_which_learned_says_how_many_in_table_and_figure():
    """Not "did not learn at L": that would misreport a row whose seeds learned 2 times in 3."""
    from poslab.report.figures import accuracy_figure

    def seeds(scheme, accuracies):
        runs = [(s, with_summary(rows_of(a, scheme=scheme))) for s, a in enumerate(accuracies)]
        return merge_seeds(runs, scheme)

    merged = seeds("rope", [[0.95, 0.5], [0.95, 0.4], [0.5, 0.1]]) + seeds(
        "t5", [[0.5, 0.5], [0.4, 0.4]]
    )
    text = markdown(merged, "needle: accuracy vs evaluation length", "scheme")
    assert "| rope (learned at L in 2/3 seeds) |" in text
    assert "| t5 (did not learn at L) |" in text
    fig = accuracy_figure(merged, "scheme", "needle")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "rope (learned at L in 2/3 seeds)" in labels and "t5 (did not learn at L)" in labels


def test_training_stops_at_the_validation_accuracy_and_reports_the_step(tmp_path):
    from poslab.run.training import run_training

    out = tmp_path / "run"
    cfg = compose_train(
        [
            "data=needle",
            "pos=alibi",
            "model=tiny",
            "model.n_layer=1",
            "data.batch_size=8",
            "data.val_examples=16",
            "trainer.max_steps=40",
            "trainer.val_check_interval=10",
            "train.stop_at_accuracy=0.0",  # any validation reaches it: stop at the first
            "train.validate_before_fit=false",  # (else step 0 would be that first)
            "eval.learned_at=0.0",
            "eval.factors=[1]",
            "eval.task_examples=4",
            "logger=csv",
        ],
        out,
    )
    run_training(cfg)
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 10  # not 40
    assert ckpt["learning"] == {"steps_to_learn": 10, "target": 0.0}
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    assert rows[0]["steps_to_learn"] == 10 and rows[0]["trained_steps"] == 10
    assert rows[0]["learned"] is True
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "completed"
    metrics = (out / "csv").rglob("metrics.csv")
    assert any("val/accuracy" in m.read_text().splitlines()[0] for m in metrics)
