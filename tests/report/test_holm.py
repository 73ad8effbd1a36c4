"""A difference's two-sided p-value (the t statistic behind its interval) and the Holm–Bonferroni
adjustment over every difference of one table (report/intervals.py, report/differences.py)."""

from __future__ import annotations

import random

import pytest

from poslab.report.compare import differences
from poslab.report.differences import holm_table, p_text
from poslab.report.intervals import (
    Interval,
    holm,
    paired_difference,
    t_interval,
    welch_interval,
)


def test_holm_matches_a_hand_computed_example():
    # sorted: 0.005×4 = 0.02, 0.01×3 = 0.03, 0.03×2 = 0.06, 0.04×1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5 × 2 = 1: capped at 1, and held by the max
    assert holm([0.02]) == [0.02]  # a family of one: no correction
    assert holm([]) == []


def test_holm_matches_statsmodels():
    from statsmodels.stats import multitest  # in the dev extra: the independent reference

    rng = random.Random(0)
    for m in (1, 2, 5, 30, 108):
        p = [rng.random() ** 3 for _ in range(m)]
        want = multitest.multipletests(p, method="holm")[1]
        assert holm(p) == pytest.approx(list(want))


def test_holm_is_monotone_at_least_the_plain_p_and_at_most_one():
    rng = random.Random(1)
    for _ in range(200):
        p = [rng.random() ** rng.choice((1, 4)) for _ in range(rng.randint(1, 40))]
        adjusted = holm(p)
        assert all(a >= q for a, q in zip(adjusted, p, strict=True))
        assert all(a <= 1.0 for a in adjusted)
        pairs = sorted(zip(p, adjusted, strict=True))
        # order kept: a smaller plain p never has a larger adjusted one
        assert all(a1 <= a2 for (_, a1), (_, a2) in zip(pairs, pairs[1:], strict=False))
        # Bonferroni bounds it from above: m × p, capped
        assert all(a <= min(1.0, len(p) * q) + 1e-12 for a, q in zip(adjusted, p, strict=True))


def random_samples(rng: random.Random, n: int, shift: float) -> list[float]:
    return [rng.gauss(shift, rng.choice((0.5, 1.0, 3.0))) for _ in range(n)]


def test_p_is_below_005_exactly_when_the_95_interval_excludes_0_paired_and_welch():
    rng = random.Random(2)
    seen = {True: 0, False: 0}
    for _ in range(400):
        n = rng.randint(2, 8)
        shift = rng.choice((0.0, 0.5, 1.5, 4.0))
        paired = t_interval(random_samples(rng, n, shift))
        welch = welch_interval(
            random_samples(rng, n, shift), random_samples(rng, rng.randint(2, 8), 0)
        )
        for interval in (paired, welch):
            if abs(interval.p - 0.05) < 1e-6:  # on the line: rounding decides, nothing to test
                continue
            assert (interval.p < 0.05) == interval.distinguishable
            seen[interval.distinguishable] += 1
    assert min(seen.values()) > 50  # both outcomes were tried, many times


def test_p_matches_scipys_t_tests():
    stats = pytest.importorskip("scipy.stats")
    diffs = [0.3, -0.1, 0.5, 0.2]
    assert t_interval(diffs).p == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
    a, b = [1.0, 1.4, 0.7, 1.9], [0.2, 0.9, 0.4]
    want = stats.ttest_ind(a, b, equal_var=False).pvalue
    assert welch_interval(a, b).p == pytest.approx(want, rel=1e-9)
    scheme, base = {"1": 10.2, "2": 11.5, "3": 9.9}, {"1": 10.0, "2": 11.0, "3": 10.1}
    want = stats.ttest_rel(list(scheme.values()), list(base.values())).pvalue
    assert paired_difference(scheme, base).p == pytest.approx(want, rel=1e-9)


def test_a_difference_without_spread_or_without_an_interval_has_the_p_it_should():
    assert t_interval([-2.0, -2.0, -2.0]).p == 0.0  # the same in every seed: certain
    assert t_interval([0.0, 0.0]).p == 1.0
    assert Interval(1.0, None, None, 1).p is None  # one seed: no p, as no interval
    assert t_interval([5.0]).p is None


def test_the_holm_table_adjusts_over_every_difference_of_its_table_and_names_the_family():
    found = {
        "alibi": [t_interval([-2.0, -2.1, -1.9]), t_interval([-1.0, 0.5, 0.2])],
        "t5": [t_interval([0.1, 0.3, 0.2]), None],
        "nope": [Interval(1.0, None, None, 1), Interval(5.0, None, None, 1)],  # one seed
    }
    text = holm_table(found, ["64", "128"])
    plain = [found["alibi"][0].p, found["alibi"][1].p, found["t5"][0].p]
    adjusted = holm(plain)
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    shown = [f"{p_text(a)} ({p_text(q)})" for a, q in zip(adjusted, plain, strict=True)]
    assert lines["| alibi"] == f"| alibi | {shown[0]} | {shown[1]} |"
    assert lines["| t5"] == f"| t5 | {shown[2]} | — |"
    assert shown[0] == "0.002 (<0.001)"  # −2 ± 0.1 over 3 seeds: p ≈ 0.0008, × 3 by Holm
    assert "| nope" not in lines  # no interval, no p: not in the family either
    assert "Holm over the 3 differences of this table" in text
    assert holm_table({"nope": found["nope"]}, ["64", "128"]) == ""


def test_every_table_of_differences_has_its_holm_p_below_it():
    def row(scheme, length, ppl):
        values = dict(zip("123", ppl, strict=True))
        return {
            "scheme": scheme,
            "mode": "nonoverlapping",
            "length": length,
            "factor": length / 64,
            "status": "ok",
            "ppl": sum(ppl) / 3,
            "n_seeds": 3,
            "per_seed": {"ppl": values},
        }

    rows = [
        row("rope", 64, [10.0, 11.0, 12.0]),
        row("rope", 128, [20.0, 21.0, 22.0]),
        row("alibi", 64, [9.0, 10.1, 10.9]),
        row("alibi", 128, [12.0, 12.5, 14.0]),
    ]
    text = differences(rows, "rope", "nonoverlapping")
    # two lengths and the ratio column; the ratio has no interval here (no per-seed ratios):
    # no p either, and not one of the family
    assert "| scheme | 64 | 128 | ratio 2× ÷ 1× |" in text
    assert "| alibi | 0.003 (0.003) | <0.001 (<0.001) | — |" in text
    assert "Holm over the 2 differences of this table" in text
    assert text.index("| alibi | 3 paired |") < text.index("Holm-adjusted p")
