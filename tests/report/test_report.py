"""Reports and comparisons from synthetic result rows: non-finite (diverged) rows, readable
perplexity axes, the shape checks of models that did not learn, and compare.py's errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from conftest import REPO, run_in_process

from poslab.errors import ConfigError
from poslab.report.compare import compare, shape_checks
from poslab.report.figures import log_binned, position_figure, ppl_figure
from poslab.report.files import write_reports
from poslab.report.tables import markdown, markdown_table

ROOT = Path(__file__).resolve().parents[2]
NAN, INF = float("nan"), float("inf")


def row(scheme, length, ppl, status="ok", train_length=64, mode="nonoverlapping", **extra):
    loss = math.log(ppl) if math.isfinite(ppl) and ppl > 0 else ppl
    return {
        "scheme": scheme,
        "train_length": train_length,
        "mode": mode,
        "split": "validation",
        "length": length,
        "factor": length / train_length,
        "word_level": True,
        "position_offset": 0,
        "status": status,
        "tokens": 1000,
        "loss": loss,
        "ppl": ppl,
        "word_ppl": ppl,
        "tokens_per_s": 1e4,
        "seconds": 0.1,
        "loss_by_position": [[p, loss, 10] for p in range(0, length, max(1, length // 8))],
        **extra,
    }


def curve(scheme, ppls, **kw):
    """Rows at 64, 128, 256, ... for the given perplexities."""
    return [row(scheme, 64 * 2**i, p, **kw) for i, p in enumerate(ppls)]


# ---------------------------------------------------------------- non-finite rows


def test_markdown_shows_nonfinite_rows_and_keeps_dash_for_skipped():
    rows = [
        *curve("rope", [20.0, 25.0]),
        row("alibi", 64, NAN, status="nonfinite"),
        row("alibi", 128, INF, status="nonfinite"),
        row("learned", 64, 30.0),
        row("learned", 128, NAN, status="skipped: beyond the table"),
        row("t5", 64, 22.0),
        row("t5", 128, NAN),  # an older file: "ok" with a NaN value
    ]
    table = markdown_table(rows, "ppl")
    assert "| rope | 20.00 | 25.00 |" in table
    assert "| alibi | nonfinite | nonfinite |" in table
    assert "| learned | 30.00 | — |" in table
    assert "| t5 | 22.00 | nonfinite |" in table
    text = markdown(rows, "title", "scheme")
    assert "nonfinite = the model diverged" in text and "— = a length" in text


def test_write_reports_with_every_row_nonfinite_writes_every_file(tmp_path):
    rows = [row("alibi", n, NAN, status="nonfinite") for n in (64, 128, 256)]
    rows[1]["loss"] = rows[1]["ppl"] = INF
    paths = write_reports(rows, tmp_path, "diverged")
    for p in paths.values():
        assert p.stat().st_size > 0
    with paths["csv"].open() as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["nonfinite"] * 3
    assert "| nonoverlapping | nonfinite | nonfinite | nonfinite |" in paths["md"].read_text()
    assert json.loads(paths["json"].read_text())[0]["status"] == "nonfinite"


def test_plots_leave_out_nonfinite_values():
    rows = [
        *curve("rope", [20.0, 25.0, 40.0]),
        *curve("alibi", [NAN, INF, NAN], status="nonfinite"),
        *curve("t5", [21.0, NAN, 23.0]),  # older file: "ok" but NaN at 128
    ]
    rows[0]["loss_by_position"][1][1] = NAN  # one NaN bucket in an otherwise finite row
    fig = ppl_figure(rows, "scheme", "t")
    try:
        lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines() if ln.get_label()[0] != "_"}
        assert set(lines) == {"rope", "t5"}
        assert list(lines["t5"].get_xdata()) == [64, 256]
        assert "alibi" in " ".join(t.get_text() for t in fig.texts)  # named as not plotted
    finally:
        plt.close(fig)
    fig = position_figure(rows, "t")
    try:
        for ln in fig.axes[0].get_lines():
            assert all(math.isfinite(y) for y in ln.get_ydata())
        labels = {ln.get_label() for ln in fig.axes[0].get_lines()}
        assert not any(label.startswith("alibi") for label in labels)
    finally:
        plt.close(fig)
    assert log_binned([[0, NAN, 5], [1, 2.0, 5]]) == log_binned([[1, 2.0, 5]])


# ---------------------------------------------------------------- readable perplexity axis


def labelled_ticks(fig) -> list[float]:
    """The numbers of the rendered y tick labels (major and minor) that carry text."""
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = sorted(ax.get_ylim())
    ticks = ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
    # the ticks drawn: the locators also place some just outside the view, never drawn
    drawn = [t.label1 for t in ticks if lo * 0.999 <= t.get_loc() <= hi * 1.001]
    drawn = sorted((t for t in drawn if t.get_text().strip()), key=lambda t: t.get_position()[1])
    assert not ax.yaxis.get_offset_text().get_text()  # no "+1.329e4" / "1e4" beside the axis
    boxes = [t.get_window_extent() for t in drawn]
    for below, above in zip(boxes, boxes[1:], strict=False):
        assert below.y1 <= above.y0 + 1, "overlapping tick labels"
    values = []
    for text in (t.get_text() for t in drawn):
        plain = text.replace(",", "").replace("\u2212", "-")
        assert "e" not in plain.lower() and "$" not in plain, text  # no sci/mathtext notation
        values.append(float(plain))
    return values


@pytest.mark.parametrize(
    "ppls",
    [
        [13290.0, 13305.0, 13322.0, 13340.0],  # close together
        [13290.2, 13292.0, 13294.0, 13295.8],  # closer: labelled -1 ... 7 (an unshown offset)
        [10.0, 100.0, 1000.0, 10000.0],  # 1e1-1e4
        [101.0, 140.0, 180.0, 260.0],  # under one decade
        [20.0, 45.0, 300.0, 900.0],  # between one and three decades
        [1.5, 1.52, 1.55, 1.51],  # small and close
        [88.5, 88.5, 88.5, 88.5],  # flat
    ],
)
def test_ppl_axis_labels_are_plain_numbers_in_the_data_range(ppls):
    rows = curve("rope", ppls) + curve("alibi", [p * 1.001 for p in ppls])
    fig = ppl_figure(rows, "scheme", "t")
    try:
        values = labelled_ticks(fig)
        lo, hi = min(r["ppl"] for r in rows), max(r["ppl"] for r in rows)
        assert len(set(values)) >= 2, values
        span = hi - lo if hi > lo else 0.1 * hi
        for v in values:
            assert lo / 2 - span <= v <= hi * 2 + span, (v, lo, hi)
        # close values read as close: the labels lie within a few spans of the data
        if hi / lo < 1.1:
            assert all(lo - span <= v <= hi + span for v in values), values
    finally:
        plt.close(fig)


def test_ppl_plot_with_no_finite_value_is_written_with_a_note(tmp_path):
    rows = [row("alibi", n, NAN, status="nonfinite") for n in (64, 128)]
    fig = ppl_figure(rows, "scheme", "t")
    try:
        fig.canvas.draw()
        notes = [t.get_text() for t in fig.axes[0].texts]
        assert any("no finite perplexity" in t for t in notes)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------- shape checks


def shape_rows(ratios, ppl1=100.0, vocab_size=None):
    out = []
    for scheme, r in ratios.items():
        for factor, ppl in ((1.0, ppl1), (8.0, ppl1 * r)):
            out.append(
                {
                    "scheme": scheme,
                    "mode": "nonoverlapping",
                    "factor": factor,
                    "length": int(64 * factor),
                    "ppl": ppl,
                    "loss": math.log(ppl),
                    "status": "ok",
                    "vocab_size": vocab_size,
                }
            )
    return out


def test_shape_checks_of_models_that_learned_are_unchanged():
    ratios = {"sinusoidal": 5.0, "rope": 1.5, "alibi": 0.97, "t5": 1.1}
    good = shape_checks(shape_rows(ratios, vocab_size=8192))
    assert len(good) == 4 and all(line.startswith("- [x]") for line in good)
    bad = {"sinusoidal": 2.0, "rope": 1.01, "alibi": 1.2, "t5": 1.5}
    assert all(line.startswith("- [ ]") for line in shape_checks(shape_rows(bad, 100.0, 8192)))


def test_shape_checks_refuse_to_tick_a_model_that_did_not_learn():
    rows = shape_rows({"alibi": 1.0}, ppl1=8190.0, vocab_size=8192)
    (line,) = shape_checks(rows)
    assert line.startswith("- [n/a]") and "[x]" not in line
    assert "alibi did not learn: ppl 8190 at 1× ≈ vocab 8192" in line
    # half of the uniform guess is still not "clearly below" it
    (line,) = shape_checks(shape_rows({"alibi": 1.0}, ppl1=5000.0, vocab_size=8192))
    assert line.startswith("- [n/a]") and "not clearly below vocab 8192" in line
    # without vocab_size (older files) a flat, finite model is judged as before
    (line,) = shape_checks(shape_rows({"alibi": 1.0}, ppl1=8190.0))
    assert line.startswith("- [x]")


def test_shape_checks_of_diverged_models_are_not_applicable():
    rows = shape_rows({"sinusoidal": 5.0, "rope": 1.5, "alibi": 0.97, "t5": 1.1}, 100.0, 8192)
    for r in rows:
        if r["scheme"] == "rope":
            r.update(status="nonfinite", ppl=NAN, loss=NAN)
        if r["scheme"] == "alibi" and r["factor"] == 8.0:
            r.update(ppl=INF, loss=INF)  # an older file: "ok" with inf
    lines = dict(zip(("sinusoidal", "rope", "alibi", "t5"), shape_checks(rows), strict=True))
    assert lines["sinusoidal"].startswith("- [x]")
    assert lines["rope"].startswith("- [n/a]") and "rope did not learn: nonfinite" in lines["rope"]
    assert lines["alibi"].startswith("- [n/a]") and "alibi diverged at 8×" in lines["alibi"]
    assert lines["t5"].startswith("- [n/a]") and "rope did not learn" in lines["t5"]


# ---------------------------------------------------------------- compare


def write_run(folder: Path, rows: list[dict]) -> Path:
    (folder / "extrapolation").mkdir(parents=True)
    (folder / "extrapolation" / "extrapolation.json").write_text(json.dumps(rows))
    return folder


def test_compare_with_a_diverged_and_an_unlearned_scheme(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    write_run(sweep / "0", curve("rope", [20.0, 21.0, 23.0, 30.0], vocab_size=8192))
    write_run(sweep / "1", curve("alibi", [8190.0] * 4, vocab_size=8192))
    write_run(sweep / "2", curve("t5", [NAN] * 4, status="nonfinite", vocab_size=8192))
    rows = compare([sweep], tmp_path / "out")
    assert {r["scheme"] for r in rows} == {"rope", "alibi", "t5"}
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "| t5 | nonfinite | nonfinite | nonfinite | nonfinite |" in text
    assert "- [x] rope ppl at 8×" in text
    assert "- [n/a] alibi ppl at 8×" in text and "alibi did not learn" in text
    assert "- [n/a] t5 ratio" in text
    for name in ("comparison_ppl.png", "comparison_loss_by_position.png", "comparison.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_compare_errors_name_the_folder(tmp_path):
    with pytest.raises(ConfigError, match="no such file or folder: .*missing; pass run folders"):
        compare([tmp_path / "missing"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"under .*empty; pass run folders"):
        compare([tmp_path / "empty"], tmp_path / "out")
    bad = write_run(tmp_path / "bad", [])
    (bad / "extrapolation" / "extrapolation.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a results file"):
        compare([bad], tmp_path / "out")


@pytest.mark.parametrize("what", ["empty", "missing"])
def test_compare_script_on_no_results_exits_2_with_one_line(tmp_path, what, monkeypatch, capfd):
    folder = tmp_path / "results"
    if what == "empty":
        folder.mkdir()
    result = run_in_process("compare.py", [str(folder)], tmp_path, monkeypatch, capfd)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("error: ") and str(folder) in lines[0]
    assert "pass run folders" in lines[0]
    assert not (folder / "comparison").exists()


def test_runs_of_one_scheme_in_two_sweeps_get_distinct_labels(tmp_path):
    from poslab.report.compare import label_rows

    paths = []
    for sweep in ("sweep_a", "sweep_b"):
        path = tmp_path / sweep / "0_rope-small-L128" / "extrapolation" / "extrapolation.json"
        path.parent.mkdir(parents=True)
        row = {"scheme": "rope", "mode": "nonoverlapping", "length": 16, "status": "ok"}
        path.write_text(json.dumps([row]))
        paths.append(path)
    labels = {r["scheme"] for r in label_rows(paths)}
    assert labels == {"rope [sweep_a/0_rope-small-L128]", "rope [sweep_b/0_rope-small-L128]"}


def test_runs_of_one_scheme_are_labelled_by_the_options_they_differ_in(tmp_path):
    from poslab.report.compare import label_rows

    paths = []
    for i, base in enumerate((100, 10000)):
        run = tmp_path / f"{i}_rope-small-L128"
        (run / ".hydra").mkdir(parents=True)
        config = f"seed: 1\npos:\n  _target_: R\n  base: {base}\ndata:\n  seq_len: 128\n"
        (run / ".hydra" / "config.yaml").write_text(config)
        path = run / "extrapolation" / "extrapolation.json"
        path.parent.mkdir()
        path.write_text(
            json.dumps([{"scheme": "rope", "mode": "nonoverlapping", "length": 16, "status": "ok"}])
        )
        paths.append(path)
    labels = [r["scheme"] for r in label_rows(paths)]
    assert labels == ["rope [pos.base=100]", "rope [pos.base=10000]"]


# ---------------------------------------------------------------- seeds: mean ± sd


def write_seeded_run(folder: Path, rows: list[dict], seed: int, base: int = 10000) -> Path:
    """A run folder as a training sweep leaves it: results plus Hydra's resolved config."""
    write_run(folder, rows)
    (folder / ".hydra").mkdir()
    config = f"seed: {seed}\npos:\n  _target_: R\n  base: {base}\ndata:\n  seq_len: 64\n"
    (folder / ".hydra" / "config.yaml").write_text(config)
    return folder


def test_runs_that_differ_only_in_seed_merge_into_mean_and_sample_sd(tmp_path):
    sweep = tmp_path / "sweep"
    per_seed = {1: [10.0, 11.0, 15.0], 2: [12.0, 12.0, 18.0], 3: [14.0, 16.0, 21.0]}
    for seed, ppls in per_seed.items():
        write_seeded_run(sweep / f"{seed}_rope", curve("rope", ppls), seed)
    write_seeded_run(sweep / "9_rope", curve("rope", [30.0, 31.0, 32.0]), 1, base=100)
    rows = compare([sweep], tmp_path / "out")
    merged = {r["length"]: r for r in rows if r["scheme"] == "rope [pos.base=10000]"}
    other = [r for r in rows if r["scheme"] == "rope [pos.base=100]"]
    assert sorted(merged) == [64, 128, 256] and len(other) == 3
    at_256 = merged[256]
    assert at_256["n_seeds"] == 3 and at_256["seeds"] == "1 2 3"
    assert at_256["ppl"] == pytest.approx(18.0)
    assert at_256["ppl_sd"] == pytest.approx(3.0)  # sample sd of 15, 18, 21
    # the shape is taken seed by seed: 1.5, 1.5, 1.5 -> no spread, though the levels differ
    assert at_256["ratio"] == pytest.approx(1.5) and at_256["ratio_sd"] == pytest.approx(0.0)
    assert merged[64]["ppl_sd"] == pytest.approx(2.0)
    assert "n_seeds" not in other[0]
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "| rope [pos.base=10000] | 12.00 ± 2.00 | 13.00 ± 2.65 | 18.00 ± 3.00 |" in text
    assert "| rope [pos.base=100] | 30.00 | 31.00 | 32.00 |" in text
    note = "(rope [pos.base=10000]) show mean ± sample sd over 3 seeds; the other rows are one seed"
    assert note in text
    with (tmp_path / "out" / "comparison.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert {r["n_seeds"] for r in csv_rows if r["scheme"] == "rope [pos.base=10000]"} == {"3"}


def test_a_seed_that_diverged_makes_the_merged_cell_nonfinite(tmp_path):
    write_seeded_run(tmp_path / "a", curve("alibi", [10.0, 11.0]), 1)
    write_seeded_run(tmp_path / "b", curve("alibi", [10.0, NAN], status="ok"), 2)
    rows = compare([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    cells = {r["length"]: r for r in rows}
    assert cells[64]["status"] == "ok" and cells[64]["n_seeds"] == 2
    assert cells[128]["status"] == "nonfinite"
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "| alibi | 10.00 ± 0.00 | nonfinite |" in text


def test_a_table_of_single_runs_says_it_has_one_seed_per_row(tmp_path):
    write_run(tmp_path / "a", curve("rope", [10.0, 11.0]))
    write_run(tmp_path / "b", curve("alibi", [10.0, 10.0]))
    compare([tmp_path], tmp_path / "out")
    assert "One seed per row (no spread)." in (tmp_path / "out" / "comparison.md").read_text()


def test_runs_alike_in_every_option_including_seed_keep_their_folder_labels(tmp_path):
    write_seeded_run(tmp_path / "a", curve("rope", [10.0, 11.0]), 1)
    write_seeded_run(tmp_path / "b", curve("rope", [12.0, 13.0]), 1)
    rows = compare([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert {r["scheme"] for r in rows} == {"rope [a]", "rope [b]"}


def test_shape_checks_state_n_and_the_interval_and_say_when_it_holds_the_line():
    rows = shape_rows({"sinusoidal": 5.0, "rope": 1.12, "alibi": 0.97, "t5": 1.1})
    for r in rows:
        if r["factor"] == 8.0:  # merged over 3 seeds: mean of the seeds' ratios and their sd
            sd = {"rope": 0.05, "t5": 0.01}.get(r["scheme"], 0.001)
            r.update(n_seeds=3, ratio=r["ppl"] / 100.0, ratio_sd=sd)
    checks = "\n".join(shape_checks(rows))
    # rope: 1.12 ± t(0.975, 2) · 0.05 / √3 = 1.12 ± 0.124, which holds the 1.10 line
    assert (
        "- [?] rope ppl at 8× clearly (≥ 10%) above its own at 1× (ratio 1.12 [1.00, 1.24], "
        "n = 3); its 95% CI holds the line: not settled at these seeds" in checks
    )
    assert "(ratio 0.97 [0.97, 0.97], n = 3)\n" in checks + "\n"
    # t5 between alibi and rope, but rope − t5 (Welch, 3 vs 3 seeds) is not distinguishable
    t5_line = next(line for line in checks.splitlines() if "t5 ratio" in line)
    # met by the means, but the order rests on an indistinguishable difference: not settled
    assert t5_line.startswith("- [?] t5 ratio at 8× between alibi and rope (0.97 [0.97, 0.97]")
    assert "rope − t5 +0.020 [" in t5_line and t5_line.endswith("not distinguishable")
    assert "t5 − alibi" not in t5_line  # that difference is clear


def test_runs_that_differ_in_any_setting_besides_the_seed_are_not_merged(tmp_path):
    runs = [
        (1, "elu1", [10.0, 11.0]),
        (2, "elu1", [12.0, 13.0]),
        (3, "relu", [50.0, 51.0]),
        (4, "relu", [52.0, 53.0]),
    ]
    for seed, feature_map, ppls in runs:
        run = write_seeded_run(tmp_path / f"{seed}_rope", curve("rope", ppls), seed)
        config = run / ".hydra" / "config.yaml"
        config.write_text(
            config.read_text() + f"attention:\n  feature_map: {feature_map}\n"
            f"run_name: rope-{seed}\n"
        )
    rows = compare([tmp_path], tmp_path / "out")
    merged = {r["scheme"]: r for r in rows if r["length"] == 64}
    assert set(merged) == {"rope [attention.feature_map=elu1]", "rope [attention.feature_map=relu]"}
    assert merged["rope [attention.feature_map=relu]"]["ppl"] == pytest.approx(51.0)
    assert merged["rope [attention.feature_map=relu]"]["n_seeds"] == 2


def test_a_run_made_before_an_option_existed_merges_only_with_that_options_old_value(tmp_path):
    # seed 1 predates pos.position_dtype and eval.rope_scaling (it ran in fp32, unscaled);
    # seed 2 names both old values, seed 3 names bf16
    scaling = "eval:\n  rope_scaling:\n    kind: none\n    factor: auto\n    beta_fast: 32\n"
    for seed, dtype, ppls in [
        (1, None, [10.0, 11.0]),
        (2, "fp32", [12.0, 13.0]),
        (3, "bf16", [50.0, 51.0]),
    ]:
        run = write_seeded_run(tmp_path / f"{seed}_alibi", curve("alibi", ppls), seed)
        if dtype is not None:
            config = run / ".hydra" / "config.yaml"
            named = f"_target_: R\n  position_dtype: {dtype}\n"
            config.write_text(config.read_text().replace("_target_: R\n", named) + scaling)
    rows = compare([tmp_path], tmp_path / "out")
    merged = {r["scheme"]: r for r in rows if r["length"] == 64}
    assert set(merged) == {"alibi [pos.position_dtype=fp32]", "alibi [pos.position_dtype=bf16]"}
    old_and_new = merged["alibi [pos.position_dtype=fp32]"]
    assert old_and_new["seeds"] == "1 2" and old_and_new["ppl"] == pytest.approx(11.0)
    assert old_and_new["ppl_sd"] == pytest.approx(2**0.5)
    assert "n_seeds" not in merged["alibi [pos.position_dtype=bf16]"]


def test_an_option_missing_from_one_run_and_not_known_as_added_later_keeps_runs_apart(tmp_path):
    for seed, extra in [(1, ""), (2, "model:\n  width: 7\n")]:
        run = write_seeded_run(tmp_path / f"{seed}_alibi", curve("alibi", [10.0, 11.0]), seed)
        config = run / ".hydra" / "config.yaml"
        config.write_text(config.read_text() + extra)
    rows = compare([tmp_path], tmp_path / "out")
    assert {r["scheme"] for r in rows} == {"alibi [model.width=None]", "alibi [model.width=7]"}


def test_a_run_without_a_config_does_not_stop_the_others_merging(tmp_path):
    for seed in (1, 2):
        write_seeded_run(tmp_path / f"{seed}_rope", curve("rope", [10.0 + seed, 11.0]), seed)
    write_run(tmp_path / "eval_out", curve("rope", [30.0, 31.0]))  # an eval.py out_dir
    rows = compare([tmp_path], tmp_path / "out")
    merged = {r["scheme"]: r for r in rows if r["length"] == 64}
    assert set(merged) == {"rope", "rope [eval_out]"}
    assert merged["rope"]["seeds"] == "1 2" and merged["rope"]["ppl"] == pytest.approx(11.5)


def test_rows_whose_runs_differ_besides_the_scheme_say_how_with_precision_resolved(tmp_path):
    """alibi trained 150 steps beside rope trained 500 never reads as a like-for-like row: the
    report's legend table gives every differing setting, `precision=auto` as it resolved."""
    from poslab.report.compare import compare

    sweep = tmp_path / "sweep"
    for scheme, steps, precision in (("rope", 500, "32-true"), ("alibi", 150, "bf16-mixed")):
        run = sweep / f"0_{scheme}"
        write_run(run, curve(scheme, [10.0, 11.0, 12.0]))
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: 1\npos:\n  _target_: {scheme}\ntrainer:\n  max_steps: {steps}\n"
            "  precision: auto\ndata:\n  seq_len: 64\n"
        )
        (run / "run.json").write_text(json.dumps({"scheme": scheme, "precision": precision}))
    compare([sweep], tmp_path / "out")
    report = (tmp_path / "out" / "comparison.md").read_text()
    table = report.split("### what differs between the rows' runs", 1)[1]
    assert "`trainer.max_steps` | `trainer.precision`" in table
    assert "| rope | 500 | 32-true |" in table and "| alibi | 150 | bf16-mixed |" in table
    assert "data.seq_len" not in table  # what the runs share is not listed


def test_rows_whose_runs_agree_besides_the_scheme_get_no_legend_table(tmp_path):
    from poslab.report.compare import compare

    sweep = tmp_path / "sweep"
    for scheme in ("rope", "alibi"):
        write_seeded_run(sweep / f"0_{scheme}", curve(scheme, [10.0, 11.0, 12.0]), seed=1)
    compare([sweep], tmp_path / "out")
    assert "what differs" not in (tmp_path / "out" / "comparison.md").read_text()


def test_sliding_minus_nonoverlapping_is_paired_by_seed_within_each_scheme(tmp_path):
    sweep = tmp_path / "sweep"
    # sliding is better at 64 (more context) by 1.0, 1.5, 2.0; worse at 128 by 3, 3.5, 4
    for seed, shift in ((1, 0.0), (2, 0.5), (3, 1.0)):
        rows = curve("rope", [20.0 + shift, 22.0 + shift])
        rows += curve("rope", [19.0, 25.0 + 2 * shift], mode="sliding")
        write_seeded_run(sweep / f"{seed}_rope", rows, seed)
    compare([sweep], tmp_path / "out")
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "### sliding minus nonoverlapping: perplexity, mean [95% CI]" in text
    line = next(x for x in text.splitlines() if x.startswith("| rope | 3 paired |"))
    # differences −1.0, −1.5, −2.0 (mean −1.5, sd 0.5): −1.5 ± 4.303 · 0.5 / √3 = ± 1.24
    assert "−1.50 [−2.74, −0.26]" in line
    # +3, +3.5, +4: the same spread
    assert "+3.50 [+2.26, +4.74]" in line


def test_the_first_line_says_where_only_some_rows_recorded_precision_and_cap():
    """A table merging rows of older runs (which recorded neither) with new ones must not claim
    the new rows' precision and cap for all of them."""
    from poslab.report.tables import scored_note

    new = {"status": "ok", "tokens": 100, "precision": "32-true", "max_tokens": None}
    old = {"status": "ok", "tokens": 100}
    assert scored_note([new, new]) == " (100 tokens scored; the whole split; precision 32-true)"
    assert scored_note([old, new]) == (
        " (100 tokens scored; the whole split where recorded; precision 32-true where recorded)"
    )


def test_the_seeds_note_keeps_a_row_name_with_a_comma_whole():
    from poslab.report.tables import seeds_note

    rows = [
        {"scheme": "alibi", "n_seeds": 3},
        {"scheme": "nope, stick-breaking", "n_seeds": 3},
        {"scheme": "nope", "n_seeds": 1},
    ]
    assert seeds_note(rows) == (
        "Rows merged over seeds (alibi; nope, stick-breaking) show mean ± sample sd over 3 "
        "seeds; the other rows are one seed."
    )
    assert "(alibi, rope)" in seeds_note([*rows[:1], {"scheme": "rope", "n_seeds": 3}, rows[2]])


def test_rows_that_measured_context_use_get_their_figure_and_others_none(tmp_path):
    """The committed context-use study: one line per row in both panels (the gain by length,
    and by position at the longest length); a table without context use draws no such figure."""
    from poslab.report.figures import context_figure

    rows = json.loads((REPO / "docs/results/context_use_quickstart/comparison.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    figure = context_figure(rows, "scheme")
    left, right = figure.axes[:2]
    schemes = {r["scheme"] for r in rows if r.get("context_gain") is not None}
    assert len(schemes) >= 6  # rope, alibi, nope and the eval-time kinds on rope
    assert len([ln for ln in left.get_lines() if ln.get_label() in schemes]) == len(schemes)
    assert len(right.get_lines()) >= len(schemes)
    plt.close(figure)
    plain = [{k: v for k, v in r.items() if "gain" not in k} for r in rows]
    assert context_figure(plain, "scheme") is None
    names = [name for _, name, fig in write_figures(rows) if not plt.close(fig)]
    assert "comparison_context.png" in names


def write_figures(rows: list[dict]) -> list:
    from poslab.report.files import report_figures

    return list(report_figures(rows, "title", "scheme", "comparison", baseline="rope"))


def test_merged_seeds_average_the_gain_by_distance_token_weighted():
    from poslab.report.seeds import merge_seeds

    def row(gain: float) -> dict:
        return {
            "scheme": "rope",
            "mode": "nonoverlapping",
            "length": 32,
            "train_length": 16,
            "status": "ok",
            "ppl": 10.0,
            "loss": 2.3,
            "context_gain": gain,
            "gain_by_distance": [[0, 0.0, 5], [16, gain, 5]],
        }

    (merged,) = merge_seeds([(1, [row(0.2)]), (2, [row(0.6)])], "rope")
    assert merged["context_gain"] == pytest.approx(0.4)
    assert merged["gain_by_distance"] == [[0, 0.0, 10], [16, pytest.approx(0.4), 10]]


def configured_run(folder: Path, scheme: str, config: str, precision: str) -> Path:
    """A run folder with its results, Hydra's config (`config`, YAML) and the run.json that
    records what precision=auto resolved to."""
    write_run(folder, curve(scheme, [10.0, 11.0, 12.0]))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(config)
    (folder / "run.json").write_text(json.dumps({"scheme": scheme, "precision": precision}))
    return folder


def test_new_runs_beside_a_committed_table_give_the_settings_its_rows_differ_in(tmp_path):
    """A committed table's rows keep the settings that differed when it was made; new runs
    merged beside it give their values of those settings (precision resolved), even where the
    new runs agree, and a setting a committed row did not record reads as not recorded."""
    from poslab.report.compare import compare

    first = tmp_path / "first"
    for scheme, precision in (("rope", "32-true"), ("alibi", "bf16-mixed")):
        config = f"seed: 1\npos:\n  _target_: {scheme}\ntrainer:\n  precision: auto\n"
        configured_run(first / f"0_{scheme}", scheme, config, precision)
    compare([first], tmp_path / "committed")
    new = tmp_path / "new"
    for scheme, scale in (("t5", "false"), ("sinusoidal", "true")):
        config = (
            f"seed: 1\npos:\n  _target_: {scheme}\ntrainer:\n  precision: auto\n"
            f"model:\n  scale_embeddings: {scale}\n"
        )
        configured_run(new / f"0_{scheme}", scheme, config, "bf16-mixed")
    compare([tmp_path / "committed" / "comparison.json", new], tmp_path / "out")
    table = (tmp_path / "out" / "comparison.md").read_text().split("### what differs", 1)[1]
    assert "| rope | 32-true | — |" in table and "| alibi | bf16-mixed | — |" in table
    assert "| t5 | bf16-mixed | False |" in table
    assert "| sinusoidal | bf16-mixed | True |" in table
    assert "— : not recorded for that row" in table


def test_an_option_searched_per_seed_merges_its_seeds_only_when_named(tmp_path):
    """LongRoPE children fine-tuned with factors searched on each parent differ in those
    factors seed by seed: by default each seed is its own row; --per-seed KEY makes them one
    configuration (mean ± sd over the seeds), and a run differing elsewhere stays apart."""
    from poslab.report.compare import main

    sweep = tmp_path / "sweep"
    for seed in (1, 2, 3):
        run = write_run(sweep / f"{seed}_rope", curve("rope", [10.0 + seed, 11.0 + seed]))
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: {seed}\npos:\n  _target_: R\n  scaling:\n    long_factor: [1.0, {seed}.5]\n"
        )
    apart = write_run(sweep / "9_rope", curve("rope", [30.0, 31.0]))
    (apart / ".hydra").mkdir()
    (apart / ".hydra" / "config.yaml").write_text(
        "seed: 1\npos:\n  _target_: R\n  base: 7\n  scaling:\n    long_factor: [1.0, 1.5]\n"
    )
    split = compare([sweep], tmp_path / "split")
    assert len({r["scheme"] for r in split}) == 4  # every seed apart
    main([str(sweep), "--out", str(tmp_path / "out"), "--per-seed", "pos.scaling.long_factor"])
    rows = json.loads((tmp_path / "out" / "comparison.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    merged = [r for r in rows if r.get("seeds") == "1 2 3"]
    assert {r["length"] for r in merged} == {64, 128} and len({r["scheme"] for r in merged}) == 1
    assert next(r["ppl"] for r in merged if r["length"] == 64) == pytest.approx(12.0)
    assert len({r["scheme"] for r in rows}) == 2  # the run with another base stays apart
    with pytest.raises(ConfigError, match="--per-seed pos.scaling.long_factr: no run here"):
        compare([sweep], tmp_path / "typo", per_seed=["pos.scaling.long_factr"])
