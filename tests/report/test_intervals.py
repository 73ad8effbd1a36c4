"""Confidence intervals (poslab.report.intervals) and the paired differences that
`scripts/compare.py --baseline` reports."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from poslab.report.compare import compare, main
from poslab.report.files import EVALUATED_RUN, record_evaluated_run
from poslab.report.intervals import (
    paired_difference,
    t_interval,
    t_quantile,
    welch_from_summaries,
    welch_interval,
    wilson_interval,
)
from poslab.report.tables import cell

# two-sided 95% points of Student's t (any statistics table)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 9: 2.262, 30: 2.042, 1000: 1.962}


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_the_tables(df):
    assert t_quantile(0.975, df) == pytest.approx(T_975[df], abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-T_975[df], abs=1e-3)


def test_t_quantile_matches_scipy_at_fractional_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    for df in (1.3, 2.7, 5.5, 17.2):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-8)


def test_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    values = [1.0, 2.0, 4.0]
    got = t_interval(values)
    half = 4.302652729911275 * statistics.stdev(values) / math.sqrt(3)
    assert (got.mean, got.low, got.high, got.n) == pytest.approx(
        (7 / 3, 7 / 3 - half, 7 / 3 + half, 3)
    )
    one = t_interval([5.0])
    assert (one.mean, one.low, one.high, one.distinguishable) == (5.0, None, None, None)


def test_pairing_by_seed_removes_the_seeds_shared_level():
    # seeds move both schemes alike (levels 10, 20, 30); the scheme is always ~1 worse
    baseline = {"1": 10.0, "2": 20.0, "3": 30.0}
    scheme = {"1": 11.0, "2": 21.2, "3": 30.9}
    paired = paired_difference(scheme, baseline)
    assert paired.paired and paired.n == 3
    assert paired.mean == pytest.approx(1.0333333)
    assert paired.distinguishable is True and paired.low > 0
    # the same numbers unpaired: the seeds' spread swamps the difference
    unpaired = welch_interval(list(scheme.values()), list(baseline.values()))
    assert not unpaired.paired and unpaired.distinguishable is False


def test_paired_difference_falls_back_to_welch_then_to_one_seed_then_none():
    welch = paired_difference({"1": 1.0, "2": 2.0}, {"3": 0.0, "4": 0.5})
    assert not welch.paired and welch.mean == pytest.approx(1.25)
    one = paired_difference({"1": 3.0}, {"1": 1.0, "2": 5.0})
    assert (one.mean, one.low, one.n) == (2.0, None, 1)
    assert paired_difference({"1": 3.0}, {"2": 1.0}) is None


def test_welch_from_summaries_equals_welch_from_values():
    a, b = [1.0, 2.0, 3.5], [0.1, 0.5, 0.2, 0.3]
    from_values = welch_interval(a, b)
    from_summaries = welch_from_summaries(
        (statistics.fmean(a), statistics.stdev(a), 3), (statistics.fmean(b), statistics.stdev(b), 4)
    )
    assert (from_values.low, from_values.high) == pytest.approx(
        (from_summaries.low, from_summaries.high)
    )
    # scipy's Welch test gives the same interval
    stats = pytest.importorskip("scipy.stats")
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval()
    assert (from_values.low, from_values.high) == pytest.approx((ci.low, ci.high))


def test_wilson_interval_stays_in_0_1_and_matches_the_formula():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and 0.1 < high < 0.2  # not the normal approximation's [0, 0]
    low, high = wilson_interval(20, 20)
    assert high == 1.0 and 0.8 < low < 0.9
    assert wilson_interval(0, 0) is None


def test_an_accuracy_cell_carries_its_wilson_interval_over_the_pooled_examples():
    row = {"status": "ok", "accuracy": 0.5, "accuracy_sd": 0.1, "n_seeds": 2, "examples": 5}
    # two seeds of 5 examples: the interval of 5 / 10
    assert cell(row, "accuracy") == "0.50 ± 0.10 [0.24, 0.76]"
    assert cell({"status": "ok", "accuracy": 0.5}, "accuracy") == "0.50"  # a baseline row


# ---------------------------------------------------------------- compare.py --baseline


def seeded_run(folder: Path, scheme: str, ppls: list[float], seed: int) -> Path:
    """A run folder as a training sweep leaves it: results at 64, 128, 256 and its config."""
    rows = [
        {
            "scheme": scheme,
            "mode": "nonoverlapping",
            "length": 64 * 2**i,
            "train_length": 64,
            "factor": float(2**i),
            "split": "validation",
            "status": "ok",
            "ppl": p,
            "loss": math.log(p),
        }
        for i, p in enumerate(ppls)
    ]
    (folder / "extrapolation").mkdir(parents=True)
    (folder / "extrapolation" / "extrapolation.json").write_text(json.dumps(rows))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(f"seed: {seed}\npos:\n  _target_: {scheme}\n")
    return folder


def three_seeds(tmp_path: Path) -> None:
    levels = {1: 100.0, 2: 110.0, 3: 120.0}  # a seed moves every scheme alike
    for seed, level in levels.items():
        seeded_run(tmp_path / f"rope{seed}", "rope", [level, level + 10, level + 30], seed)
        # alibi: 2 better everywhere; t5: the same as rope at 1x, then ±0.5 by seed
        seeded_run(tmp_path / f"alibi{seed}", "alibi", [level - 2, level + 8, level + 28], seed)
        wobble = (-0.5, 0.5, 0.0)[seed - 1]
        seeded_run(tmp_path / f"t5{seed}", "t5", [level, level + 10 + wobble, level + 30], seed)


def differences_and_holm(text: str, heading: str) -> tuple[dict[str, str], dict[str, str]]:
    """The lines of the table of differences under `heading`, and of the Holm p below it, each
    by its first cell ("| alibi")."""
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    table, below = section.split("Holm-adjusted p", 1)

    def by_row(part: str) -> dict[str, str]:
        return {line.split(" | ")[0]: line for line in part.splitlines() if line.startswith("| ")}

    return by_row(table), by_row(below)


def test_compare_with_a_baseline_prints_paired_differences_with_intervals(tmp_path, capsys):
    three_seeds(tmp_path / "runs")
    compare([tmp_path / "runs"], tmp_path / "out", baseline="rope")
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert text == capsys.readouterr().out.split("\n\nwrote comparison")[0] + "\n"
    assert "### difference to rope (nonoverlapping): perplexity, mean [95% CI]" in text
    table, holm_p = differences_and_holm(text, "### difference to rope (nonoverlapping)")
    # alibi − rope is −2 in every seed: an interval of zero width, distinguishable
    assert table["| alibi"].startswith("| alibi | 3 paired | −2.00 [−2.00, −2.00] |")
    # t5 at 128: −0.5, +0.5, 0 -> mean 0, not distinguishable; the 1x cells equal rope's
    assert "+0.00 [−1.24, +1.24] not distinguishable" in table["| t5"]
    # below it, the p of each: −2 in every seed is p 0; t5's mean 0 at 128 is p 1, Holm too
    assert holm_p["| alibi"].startswith("| alibi | <0.001 (<0.001) | <0.001 (<0.001) |")
    assert "| 1.000 (1.000) |" in holm_p["| t5"]
    assert "| rope | 3 paired" not in text  # the baseline has no row of its own
    # the merged rows keep each seed's values, so the committed json can be paired again
    rows = json.loads((tmp_path / "out" / "comparison.json").read_text())
    alibi = next(r for r in rows if r["scheme"] == "alibi" and r["length"] == 128)
    assert alibi["per_seed"]["ppl"] == {"1": 108.0, "2": 118.0, "3": 128.0}
    compare([tmp_path / "out" / "comparison.json"], tmp_path / "again", baseline="rope")
    again = (tmp_path / "again" / "comparison.md").read_text()
    assert again.split("### difference to rope")[1] == text.split("### difference to rope")[1]


def test_eval_out_dirs_of_the_seeds_of_one_run_merge_over_seeds_and_pair(tmp_path):
    """eval.py out_dirs (no config of their own) on three seeds' checkpoints: each names the
    run it evaluated, so one eval-time kind on the three seeds is one row, paired with the
    plain evaluation of the same checkpoints."""
    for seed, level in {1: 100.0, 2: 110.0, 3: 120.0}.items():
        run = seeded_run(tmp_path / "runs" / f"rope{seed}", "rope", [level] * 3, seed)
        for label, extra in (("rope", 10.0), ("rope + ntk s=auto", 7.0)):
            out = tmp_path / "evals" / f"s{seed}" / label.replace(" ", "_")
            seeded_run(out, label, [level, level + extra, level + 2 * extra], seed)
            shutil.rmtree(out / ".hydra")  # an out_dir has no config of its own
            record_evaluated_run(out, run / "checkpoints" / "best.ckpt")
    compare([tmp_path / "evals"], tmp_path / "out", baseline="rope")
    text = (tmp_path / "out" / "comparison.md").read_text()
    ntk = next(line for line in text.splitlines() if line.startswith("| rope + ntk s=auto | 3"))
    # −3 and −6 in every seed: zero-width intervals, which only pairing by seed gives
    assert ntk.startswith("| rope + ntk s=auto | 3 paired | +0.00 [+0.00, +0.00] not distinguis")
    assert "−3.00 [−3.00, −3.00] | −6.00 [−6.00, −6.00]" in ntk
    # without the record, each out_dir stands alone, labelled by its folder
    for record in (tmp_path / "evals").rglob(EVALUATED_RUN):
        record.unlink()
    compare([tmp_path / "evals"], tmp_path / "alone")
    alone = (tmp_path / "alone" / "comparison.md").read_text()
    assert "rope + ntk s=auto [s1/rope_+_ntk_s=auto]" in alone


def test_a_one_seed_row_gets_its_difference_without_an_interval(tmp_path):
    three_seeds(tmp_path / "runs")
    seeded_run(tmp_path / "runs" / "nope1", "nope", [101.0, 115.0, 140.0], 1)
    compare([tmp_path / "runs"], tmp_path / "out", baseline="rope")
    text = (tmp_path / "out" / "comparison.md").read_text()
    nope = next(line for line in text.splitlines() if line.startswith("| nope | 1 |"))
    assert nope.startswith("| nope | 1 | +1.00 (no CI) | +5.00 (no CI) | +10.00 (no CI) |")


def test_a_baseline_that_is_no_row_is_one_line_naming_the_rows(tmp_path, capsys):
    three_seeds(tmp_path / "runs")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--baseline", "xpos"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--baseline 'xpos' is no row" in err and "'alibi'" in err and "'rope'" in err
    assert not (tmp_path / "out").exists()


def test_a_one_seed_row_of_another_seed_still_gets_its_difference(tmp_path):
    three_seeds(tmp_path / "runs")
    seeded_run(tmp_path / "runs" / "xpos9", "xpos", [95.0, 105.0, 125.0], 9)  # no shared seed
    compare([tmp_path / "runs"], tmp_path / "out", baseline="rope")
    text = (tmp_path / "out" / "comparison.md").read_text()
    xpos = next(line for line in text.splitlines() if line.startswith("| xpos | 1 |"))
    assert xpos.startswith("| xpos | 1 | −15.00 (no CI) |")  # 95 − mean(100, 110, 120)


def test_a_committed_table_stands_beside_new_runs_with_its_rows_labelled_by_its_folder(tmp_path):
    three_seeds(tmp_path / "old_runs")
    compare([tmp_path / "old_runs"], tmp_path / "committed")  # rope, alibi, t5 over 3 seeds
    for seed in (1, 2, 3):  # new seeds of a t5 variant and of the baseline
        level = 100.0 + 10 * (seed - 1)
        seeded_run(tmp_path / "new" / f"rope{seed}", "rope", [level, level + 10, level + 30], seed)
        seeded_run(tmp_path / "new" / f"t5{seed}", "t5", [level, level + 9, level + 25], seed)
    committed = tmp_path / "committed" / "comparison.json"
    rows = compare([tmp_path / "new", committed], tmp_path / "out", baseline="rope")
    names = {r["scheme"] for r in rows}
    assert names == {"rope", "t5", "rope [committed]", "t5 [committed]", "alibi"}
    text = (tmp_path / "out" / "comparison.md").read_text()
    lines, _ = differences_and_holm(text, "### difference to rope (nonoverlapping)")
    assert lines["| t5"].startswith("| t5 | 3 paired | +0.00 [+0.00, +0.00]")  # new: by seed
    assert "| t5 [committed] | 3 paired |" in text  # its per_seed values were kept
    assert lines["| alibi"].startswith("| alibi | 3 paired | −2.00")


def test_rename_and_only_choose_and_order_the_rows(tmp_path, capsys):
    three_seeds(tmp_path / "runs")
    out = tmp_path / "out"
    main(
        [
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--rename",
            "t5=t5 (md 128)",
            "--only",
            "t5 (md 128)",
            "--only",
            "rope",
            "--baseline",
            "rope",
        ]
    )
    rows = json.loads((out / "comparison.json").read_text())
    assert list(dict.fromkeys(r["scheme"] for r in rows)) == ["t5 (md 128)", "rope"]
    assert "| t5 (md 128) | 3 paired |" in (out / "comparison.md").read_text()
    for bad, said in (
        (["--rename", "xpos=x"], "--rename 'xpos': no such row"),
        (["--rename", "rope"], "--rename 'rope': write ROW=NAME"),
        (["--only", "t5 (md 128)"], "--only 't5 (md 128)': no such row"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main([str(tmp_path / "runs"), "--out", str(tmp_path / "o2"), *bad])
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and err.count("\n") == 0 and said in err, err
        assert not (tmp_path / "o2").exists()


def test_a_row_whose_label_holds_an_equals_sign_can_be_renamed_and_swapped():
    from poslab.report.compare import chosen_rows

    rows = [{"scheme": s} for s in ("rope [pos.base=100]", "rope", "t5")]
    # ROW is the longest label before an "=": the label's own "=" does not split it
    renamed = chosen_rows(rows, ["rope [pos.base=100]=rope, base 100", "t5=t5 [md=32]"], None)
    assert [r["scheme"] for r in renamed] == ["rope, base 100", "rope", "t5 [md=32]"]
    # renames apply at once: two rows can trade names
    swapped = chosen_rows(rows, ["rope=rope [pos.base=100]", "rope [pos.base=100]=rope"], None)
    assert [r["scheme"] for r in swapped] == ["rope", "rope [pos.base=100]", "t5"]


def test_join_counts_a_committed_one_seed_row_as_a_seed_of_new_runs(tmp_path, capsys):
    """A study's one-seed row (its run folder long gone) and new seeds of the same settings
    become one row of three seeds, paired by seed with the baseline."""
    three_seeds(tmp_path / "old")
    seeded_run(tmp_path / "old" / "fox1", "fox", [98.0, 107.0, 126.0], 1)
    compare([tmp_path / "old"], tmp_path / "committed")  # fox: one seed (1)
    for seed, level in ((2, 110.0), (3, 120.0)):
        seeded_run(tmp_path / "new" / f"fox{seed}", "fox", [level - 2, level + 7, level + 26], seed)
    committed = str(tmp_path / "committed" / "comparison.json")
    out = tmp_path / "out"
    args = [committed, str(tmp_path / "new"), "--out", str(out), "--baseline", "rope"]
    main([*args, "--join", "fox [committed]=fox"])
    rows = json.loads((out / "comparison.json").read_text())
    fox = next(r for r in rows if r["scheme"] == "fox" and r["length"] == 64)
    assert fox["n_seeds"] == 3 and fox["per_seed"]["ppl"] == {"1": 98.0, "2": 108.0, "3": 118.0}
    assert "fox [committed]" not in {r["scheme"] for r in rows}
    # 2 below rope at every seed: a paired difference with no spread
    assert "| fox | 3 paired | −2.00 [−2.00, −2.00] |" in (out / "comparison.md").read_text()
    for bad, said in (
        (["--join", "xpos=fox"], "--join 'xpos': no such row"),
        (["--join", "fox [committed]=xpos"], "no such row; join into one of"),
        (["--join", "rope=fox"], "the row holds 3 seeds"),
        (["--join", "fox"], "--join 'fox': write ROW=INTO"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main([*args[:3], str(tmp_path / "o2"), *args[4:], *bad])
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and err.count("\n") == 0 and said in err, err
        assert not (tmp_path / "o2").exists()


def test_the_difference_figure_gives_every_scheme_its_own_row_best_first(tmp_path):
    """compare --baseline also draws comparison_differences.png: one row per scheme (so none
    hides another), ordered by the difference at the longest length, filled where the interval
    excludes 0, and a far-off row at the panel's edge with its value written."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from poslab.report.differences import difference_set
    from poslab.report.figures import difference_figure

    three_seeds(tmp_path / "runs")
    seeded_run(tmp_path / "runs" / "nope1", "nope", [101.0, 115.0, 140.0], 1)
    seeded_run(tmp_path / "runs" / "sin1", "sinusoidal", [1000.0, 2000.0, 5000.0], 1)
    rows = compare([tmp_path / "runs"], tmp_path / "out", baseline="rope")
    assert (tmp_path / "out" / "comparison_differences.png").stat().st_size > 0
    fig = difference_figure(difference_set(rows, "rope", "nonoverlapping"), "title")
    try:
        short, longest = fig.axes
        assert (short.get_title(), longest.get_title()) == (
            "at 64 tokens (1× L)",
            "at 256 tokens (4× L)",
        )
        ticks = sorted(
            zip(short.get_yticks(), short.get_yticklabels(), strict=True), key=lambda t: -t[0]
        )
        assert [label.get_text() for _, label in ticks] == [
            "alibi (3 paired)",  # −2 at 256
            "t5 (3 paired)",  # 0
            "nope (1 seed)",  # +10
            "sinusoidal (1 seed)",  # +4,870 (seed 1 paired): off the scale
        ]
        y = {label.get_text().split(" (")[0]: value for value, label in ticks}
        marks = {
            round(line.get_ydata()[0]): line
            for line in longest.get_lines()
            if len(line.get_ydata()) == 1
        }
        alibi, t5 = marks[y["alibi"]], marks[y["t5"]]
        assert alibi.get_xdata()[0] == pytest.approx(-2.0)
        assert to_rgba(alibi.get_markerfacecolor()) == to_rgba(alibi.get_color())  # excludes 0
        assert to_rgba(t5.get_markerfacecolor()) == to_rgba("white")  # holds 0
        assert longest.get_xlim()[1] < 4870.0 / 4  # the other rows keep the scale
        texts = [t for t in longest.texts if t.get_text()]
        assert [t.get_text() for t in texts] == ["+4,870.00"]
        arrows = [a for a in longest.texts if not a.get_text()]  # annotations: arrows
        assert [a.xy for a in arrows] == [(pytest.approx(longest.get_xlim()[1]), y["sinusoidal"])]
        assert y["sinusoidal"] not in marks  # no marker inside the scale
    finally:
        plt.close(fig)


def interval_set(by_scheme: dict, lengths=(64, 128, 256), metric: str = "ppl"):
    from poslab.report.differences import DifferenceSet

    return DifferenceSet("rope", "nonoverlapping", metric, list(lengths), by_scheme, {}, {})


def test_the_difference_figure_takes_rows_with_gaps_and_clipped_intervals():
    """A row with a value only between the panels' lengths still gets its line (no crash);
    a row whose interval reaches far past the others is cut at the edge with an arrow and its
    interval written; no finite difference at all: no figure."""
    import matplotlib.pyplot as plt

    from poslab.report.figures import difference_figure
    from poslab.report.intervals import Interval

    def iv(mean, half=None, n=3):
        low = None if half is None else mean - half
        return Interval(mean, low, None if half is None else mean + half, n)

    found = interval_set(
        {
            "a": [iv(1.0, 0.5), None, iv(2.0, 0.5)],
            "b": [None, iv(3.0), None],  # only the middle length
            "c": [iv(0.3, 60.0), None, iv(-1.0, 0.2)],  # a 2-seed-like interval at 64
            "d": [iv(0.5, 0.1), None, iv(1.5, 0.3)],
        }
    )
    fig = difference_figure(found, "t")
    try:
        short, longest = fig.axes
        labels = [t.get_text() for t in short.get_yticklabels()]
        assert "b (1 seed)" in labels  # its seeds from the length it has
        # b has neither shown length: ordered after the rows that have them
        assert sorted(zip(short.get_yticks(), labels, strict=True))[0][1] == "b (1 seed)"
        written = [t.get_text() for t in short.texts if t.get_text()]
        assert written == ["+0.30 [−59.70, +60.30]"]
        assert short.get_xlim()[1] < 10  # the wide interval did not set the scale
        assert any("off the scale" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
    assert difference_figure(interval_set({"a": [None, None, None]}), "t") is None
    nan = interval_set({"a": [iv(float("nan")), None, None]})
    assert difference_figure(nan, "t") is None


def test_replot_draws_the_differences_again_to_the_baseline_the_report_names(tmp_path):
    from poslab.report.files import replot_report

    three_seeds(tmp_path / "runs")
    compare([tmp_path / "runs"], tmp_path / "with", baseline="alibi")
    compare([tmp_path / "runs"], tmp_path / "without")
    assert not (tmp_path / "without" / "comparison_differences.png").exists()
    assert "difference_plot" in replot_report(tmp_path / "with", tmp_path / "again")
    assert (tmp_path / "again" / "comparison_differences.png").stat().st_size > 0
    assert "difference_plot" not in replot_report(tmp_path / "without", tmp_path / "again2")
