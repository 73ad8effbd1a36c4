"""Results of an evaluation on disk (report/files.py, evaluation/run.py): written all or
none (a full disk keeps the previous set), and a re-evaluation never replacing the
after-training table."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable

import pytest
from conftest import contents, copy_run, file_size_limit, temporaries

from poslab.errors import ConfigError
from poslab.report.files import (
    report_rows,
    results_folder,
    temporary_path,
    write_all_or_none,
    write_reports,
)


def writer(data: bytes) -> Callable:
    return lambda f: f.write(data)


def failing(err: BaseException) -> Callable:
    def write(f) -> None:
        f.write(b"half a fi")
        raise err

    return write


def test_all_files_are_written_and_no_temporary_remains(tmp_path):
    (tmp_path / "a.json").write_text("old")
    write_all_or_none({tmp_path / "a.json": writer(b"new a"), tmp_path / "b.md": writer(b"b")})
    assert contents(tmp_path) == {"a.json": b"new a", "b.md": b"b"}
    assert temporary_path(tmp_path / "a.json").name.startswith(".a.json.")
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("err", [RuntimeError("a plot failed"), KeyboardInterrupt()])
def test_a_failure_in_any_file_replaces_none(tmp_path, err):
    old = {"a.json": b"old a", "b.csv": b"old b"}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    files = {
        tmp_path / "a.json": writer(b"new a"),  # written in full before the failure
        tmp_path / "b.csv": writer(b"new b"),
        tmp_path / "c.png": failing(err),
    }
    with pytest.raises(type(err)):
        write_all_or_none(files)
    assert contents(tmp_path) == old  # no c.png, no temporary
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_no_room_is_one_line_naming_the_path(tmp_path, code):
    (tmp_path / "a.json").write_text("old")
    err = OSError(code, "No space left on device")
    with pytest.raises(ConfigError) as caught:
        write_all_or_none({tmp_path / "a.json": writer(b"new"), tmp_path / "b.md": failing(err)})
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "b.md") in message
    assert "the disk is full" in message and "previous results are intact" in message
    assert contents(tmp_path) == {"a.json": b"old"}


def test_other_write_errors_stay_themselves(tmp_path):
    with pytest.raises(PermissionError):
        write_all_or_none({tmp_path / "a": failing(PermissionError(errno.EACCES, "denied"))})
    assert list(tmp_path.iterdir()) == []


def test_reports_under_a_real_file_size_limit_keep_the_previous_set(trained_runs, tmp_path):
    """JSON, CSV and Markdown fit under the limit, a PNG does not: nothing of the new set
    replaces the old one, and neither write_reports nor eval.py's default folder (report_rows
    without out_dir) leaves a folder it created behind."""
    run = copy_run(trained_runs["rope"][0], tmp_path / "run")
    out = run / "extrapolation"
    before = contents(out)
    rows = [{**r, "ppl": r["ppl"] * 2} for r in json.loads(before["extrapolation.json"])]
    limit = max(len(before["extrapolation.json"]), len(before["extrapolation.csv"])) + 4096
    assert limit < min(len(before["extrapolation_ppl.png"]), 50_000)
    for target in (out, tmp_path / "fresh"):
        with file_size_limit(limit), pytest.raises(ConfigError, match=r"_ppl\.png: the disk is"):
            write_reports(rows, target, "new")
    with file_size_limit(limit), pytest.raises(ConfigError, match=r"_ppl\.png: the disk is"):
        report_rows(rows, "new", run / "checkpoints/best.ckpt", None, None, None)
    assert contents(out) == before
    assert sorted(p.name for p in run.glob("extrapolation*")) == ["extrapolation"]
    assert not (tmp_path / "fresh").exists()
    assert temporaries(tmp_path) == []


def test_results_folder_takes_the_runs_extrapolation_only_while_it_is_empty(tmp_path, capsys):
    rows = [{"variant": "beyond_table=clamp, logn"}]
    assert results_folder(tmp_path, rows) == (tmp_path / "extrapolation", True)
    assert results_folder(tmp_path, rows) == (tmp_path / "extrapolation", False)  # still empty
    (tmp_path / "extrapolation" / "extrapolation.json").write_text("[]")
    first, claimed = results_folder(tmp_path, rows)
    second, _ = results_folder(tmp_path, rows)  # in the same second: a name of its own
    assert claimed and first.is_dir() and second.is_dir() and first != second
    assert first.name.startswith("extrapolation-")
    assert first.name.endswith("-beyond_table-clamp-logn")
    assert "already holds results" in capsys.readouterr().out
