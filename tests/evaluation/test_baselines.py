"""scripts/baselines.py: chance and every stated shortcut per length, with no model."""

import pytest

from poslab.evaluation.baselines import baseline_rows, main
from poslab.tasks.grid import Grid
from poslab.tasks.needle import Needle


def test_grid_copy_above_is_the_baseline_a_reader_needs():
    rows = baseline_rows(Grid(), [64], examples=300, seed=1)
    by_name = {r["predictor"]: r for r in rows}
    assert by_name["chance"]["token_accuracy"] == pytest.approx(1 / 8)
    # 1/3 of grids shift by 0 and the rest hit by chance: 1/3 + 2/3 * 1/8 = 0.42 per cell
    assert by_name["the cell above"]["token_accuracy"] == pytest.approx(0.42, abs=0.06)


def test_needle_shortcuts_stay_near_chance_at_every_length():
    task = Needle()
    rows = baseline_rows(task, [64, 256], examples=40, seed=3)
    assert {r["length"] for r in rows} == {64, 256}
    for row in rows:
        assert row["accuracy"] <= task.shortcut_margin + 0.05, row


def test_the_cli_prints_a_table_and_refuses_a_corpus(capsys):
    main(["data=needle", "--lengths", "64", "--examples", "5"])
    assert "| 64 | chance |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        main(["data=wikitext2"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: data=wikitext2 is a corpus")
