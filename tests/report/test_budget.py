"""The budget axis's tables say how many seeds each interval rests on (report/budget.py)."""

from __future__ import annotations

from poslab.report.budget import Cell, budget_table, change_table, p_text, primary_family
from poslab.report.intervals import paired_difference, t_interval


def _cell(ratios: dict[str, float], differences: dict[str, float]) -> Cell:
    zeros = dict.fromkeys(differences, 0.0)
    return Cell(
        tokens=1000,
        ratio=t_interval(list(ratios.values())),
        difference=paired_difference(differences, zeros) if differences else None,
        gain=None,
        ratios=ratios,
        differences=differences,
    )


def _budgets() -> dict[int, dict[tuple[str, str], Cell]]:
    five = {"1": 1.0, "2": 1.1, "3": 1.2, "4": 1.05, "5": 1.15}
    return {
        300: {
            ("rope", "sliding"): _cell(five, {}),
            ("alibi", "sliding"): _cell(five, {"1": -5.0, "2": -6.0, "3": -4.0, "4": -5.5}),
        },
        3000: {
            ("rope", "sliding"): _cell(five, {}),
            ("alibi", "sliding"): _cell(
                {k: v + 0.5 for k, v in five.items()}, {"1": -9.0, "2": -8.0, "3": -10.0}
            ),
        },
    }


def test_each_budget_line_names_its_seeds_and_the_seeds_its_difference_pairs():
    table, records = budget_table(_budgets(), "rope", 16)
    lines = {line.split(" | ")[2] + line.split(" | ")[0]: line for line in table.splitlines()[2:]}
    assert " | 5 | " in lines["300| rope"]  # the baseline: its own seeds, no pairing
    assert " | 5 (4 paired) | " in lines["300| alibi"]  # a seed rope lacks is not paired
    assert " | 5 (3 paired) | " in lines["3,000| alibi"]
    assert {r["difference"]["n"] for r in records if r["difference"]} == {4, 3}


def test_the_change_and_the_primary_family_name_the_seeds_they_pair():
    changes, _ = change_table(_budgets(), "rope", 16)
    alibi = next(line for line in changes.splitlines() if line.startswith("| alibi"))
    assert alibi.startswith("| alibi (sliding) | 5/3 | ")  # the ratio over 5, the difference 3
    family, records = primary_family(_budgets(), "rope", 16)
    assert family.splitlines()[2].startswith("| 1 | alibi − rope | sliding | 3 | ")
    assert records[0]["difference"]["n"] == 3


def test_a_p_value_that_rounds_to_zero_is_written_as_below_the_last_digit():
    assert p_text(0.00004, 4) == "<0.0001"
    assert p_text(0.0004, 3) == "<0.001"
    assert p_text(0.0123, 3) == "0.012"
    assert p_text(None, 3) == "—"


def test_the_figure_title_says_how_many_seeds_or_their_range():
    from poslab.report.budget import seed_counts

    budgets = _budgets()
    assert seed_counts(budgets) == "5"
    budgets[300]["rope", "sliding"] = _cell({"1": 1.0, "2": 1.1, "3": 1.2}, {})
    assert seed_counts(budgets) == "3–5"
