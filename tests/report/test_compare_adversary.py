"""scripts/compare.py against bad input, fourth pass (#60): folders of another kind that hold
results (accepted as they are), hand-edited rows that once gave a traceback or a wrong table,
and options that contradict each other or the rows. Each bad input is one `error:` line, exit
code 2, nothing written; real files on disk, compare.py's own main()."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import result_rows, write_results

from poslab.report.compare import main

EVALUATION = "extrapolation-2026-01-01_00-00-00"  # a folder eval.py writes beside a run's own


def refused(args: list[str], out: Path, capsys: pytest.CaptureFixture) -> str:
    """The one error line of compare.py ARGS --out OUT (exit code 2, nothing at OUT)."""
    with pytest.raises(SystemExit) as stop:  # (argparse: a second --out would win)
        main(args if "--out" in args else [*args, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()
    return err[0]


def table(out: Path) -> list[str]:
    """The scheme cells of the first table of comparison.md."""
    lines = (out / "comparison.md").read_text().split("### ", 2)[1].splitlines()
    return [line.split(" | ")[0].lstrip("| ") for line in lines if line.startswith("| ")][1:]


def schemes(*names: str) -> Callable[[list[dict]], None]:
    def edit(rows: list[dict]) -> None:
        for row in rows:
            row["scheme"] = names[0]

    return edit


# hand-edited or truncated rows: (what the edit does to rows 1-3 of one run, the error's text)
ROW_EDITS: list[tuple[str, Callable[[list[dict]], None], str]] = [
    (
        "row-repeated",
        lambda r: r.append(dict(r[1])),
        "row 5 of 5 (rope, nonoverlapping) repeats row 2",
    ),
    ("ppl-negative", lambda r: r[1].update(ppl=-5), "has ppl=-5, below 1"),
    ("loss-negative", lambda r: r[1].update(loss=-0.5), "has loss=-0.5, below 0"),
    ("accuracy-above-1", lambda r: r[1].update(task="passkey", accuracy=1.5), "accuracy=1.5"),
    ("accuracy-without-task", lambda r: r[1].update(accuracy=0.5), "has an accuracy but no task"),
    ("factor-contradicts", lambda r: r[1].update(factor=0), "has factor=0, but length"),
    ("scheme-empty", schemes(""), "has scheme='', not a name"),
    (
        "train-length-differs",
        lambda r: r[1].update(train_length=32, factor=1.0),
        "has train_length=32, but an earlier row of rope has 16",
    ),
    ("per-seed-text", lambda r: r[1].update(per_seed="x"), "has a per_seed that is str"),
    ("per-seed-list", lambda r: r[1].update(per_seed={"ppl": [1]}), "per_seed that is not"),
    ("n-seeds-text", lambda r: r[1].update(n_seeds="3"), "has n_seeds='3', not a whole number"),
    ("task-list", lambda r: [x.update(task=["a"]) for x in r], "has task=['a'], not a name"),
    ("settings-text", lambda r: r[1].update(settings="abc"), "has a settings that is str"),
    ("provenance-text", lambda r: [x.update(provenance="a") for x in r], "provenance that is"),
    ("context-gain-text", lambda r: r[1].update(context_gain="x"), "context_gain='x', not a"),
    (
        "context-gain-alone",
        lambda r: r[1].update(context_gain=0.5),
        "has a context_gain but no short_context",
    ),
    (
        "vocab-size-text",
        lambda r: [x.update(vocab_size="100") for x in r],
        "has vocab_size='100', not a whole number",
    ),
]


@pytest.mark.parametrize(
    ("edit", "expected"), [c[1:] for c in ROW_EDITS], ids=[c[0] for c in ROW_EDITS]
)
def test_a_hand_edited_row_is_one_line(edit, expected, tmp_path, capsys):
    rows = result_rows()
    rows.append({**rows[0], "length": 128, "factor": 8.0})  # 8x: the shape checks read it too
    edit(rows)
    run = write_results(tmp_path / "run", rows)
    other = write_results(tmp_path / "alibi", [{**r, "scheme": "alibi"} for r in result_rows()])
    line = refused([str(run), str(other), "--baseline", "alibi"], tmp_path / "out", capsys)
    assert f"{run}/extrapolation/extrapolation.json: row " in line and expected in line, line


@pytest.fixture
def two_runs(tmp_path: Path) -> list[str]:
    rope = write_results(tmp_path / "rope", result_rows())
    alibi = write_results(tmp_path / "alibi", [{**r, "scheme": "alibi"} for r in result_rows()])
    return [str(rope), str(alibi)]


OPTIONS = [
    (["--rename", "rope=alibi"], "rows 'rope' and 'alibi' would both be shown as 'alibi'"),
    (["--rename", "rope=x", "--rename", "alibi=x"], "rows 'rope' and 'alibi' would both be"),
    (["--rename", "rope=x", "--rename", "rope=y"], "--rename 'rope' is given twice"),
    (["--rename", "rope=  "], "--rename rope='  ': a row name needs text"),
    (["--rename", "rope=a|b"], "--rename rope='a|b': a row name needs text, without |"),
    (["--only", "rope", "--only", "rope"], "--only 'rope' is given twice"),
    (["--out", ""], "argument --out: the path is empty (an unset variable?)"),
    ([""], "argument paths: the path is empty"),  # it was the current folder, searched
    (["--title", ""], "--title '': a title is one line of text"),
    (["--title", "a\nb"], "--title 'a\\nb': a title is one line of text"),
]


@pytest.mark.parametrize(("args", "expected"), OPTIONS, ids=[" ".join(a) for a, _ in OPTIONS])
def test_contradictory_or_empty_options_are_one_line(args, expected, two_runs, tmp_path, capsys):
    line = refused([*two_runs, *args], tmp_path / "out", capsys)
    assert expected in line, line
    assert not (Path(two_runs[0]) / "comparison").exists()  # --out '' was the default folder


def test_a_training_run_not_evaluated_yet_is_told_to_run_eval(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    line = refused([str(run)], tmp_path / "out", capsys)
    assert f"{run} is a training run with no evaluation yet" in line
    assert f"python eval.py run={run}" in line


# folders of another kind that hold results: accepted as they are


@pytest.mark.parametrize("folder", [EVALUATION, "extrapolation"])
def test_an_eval_py_results_folder_is_accepted_as_it_is(folder, tmp_path, capsys):
    """eval.py's RUN/extrapolation-<time>/ (a re-evaluation) holds extrapolation.json itself;
    it was "no extrapolation/extrapolation.json under ..." (and so was RUN/extrapolation/)."""
    run = write_results(tmp_path / "run", result_rows())
    if folder != "extrapolation":
        (run / "extrapolation").rename(run / folder)
    main([str(run / folder), "--out", str(tmp_path / "out")])
    assert len(json.loads((tmp_path / "out" / "comparison.json").read_text())) == 3
    assert table(tmp_path / "out") == ["rope"]


def test_a_run_and_its_re_evaluation_are_two_rows_not_two_seeds(tmp_path, capsys):
    """The run's own table and RUN/extrapolation-<time>/ given together: one row each, named by
    the evaluation's folder (it was one row, the same run merged with itself)."""
    run = write_results(tmp_path / "run", result_rows())
    again = run / EVALUATION
    again.mkdir()
    (again / "extrapolation.json").write_text(json.dumps(result_rows()))
    main([str(run), str(again), "--out", str(tmp_path / "out")])
    assert table(tmp_path / "out") == ["rope [run]", f"rope [{EVALUATION}]"]


def test_a_study_folder_compares_its_runs_not_its_evaluations_too(tmp_path, capsys):
    """A study's evals/<name>/<job>/ are other evaluations of its runs: passing the study's
    folder gave each run twice (as `runs/job` and `test/job`)."""
    study = tmp_path / "study"
    write_results(study / "runs" / "rope-s1", result_rows())
    write_results(study / "evals" / "test" / "rope-s1", result_rows())
    (study / "study.json").write_text(json.dumps({"recipe": "two", "jobs": {}}))
    main([str(study), "--out", str(tmp_path / "out")])
    assert table(tmp_path / "out") == ["rope"]


def test_a_folder_compare_py_wrote_is_read_back_as_its_table(two_runs, tmp_path, capsys):
    """A comparison folder (comparison.json, as committed under docs/results/): its table, as
    the file itself would be read; it was "no extrapolation/extrapolation.json under ..."."""
    main([*two_runs, "--out", str(tmp_path / "first")])
    main([str(tmp_path / "first"), "--out", str(tmp_path / "again")])
    assert table(tmp_path / "again") == table(tmp_path / "first") == ["rope", "alibi"]


def test_a_baseline_that_is_the_only_row_says_so_in_the_report(tmp_path, capsys):
    """A study of one scheme compared with --baseline that scheme: the report says there is no
    other row (an empty differences section before), and the command still succeeds."""
    rope = write_results(tmp_path / "rope", result_rows())
    main([str(rope), "--baseline", "rope", "--out", str(tmp_path / "out")])
    report = (tmp_path / "out" / "comparison.md").read_text()
    assert "rope is the only row of these results: there is no other row" in report
    assert "### difference to rope (" not in report
