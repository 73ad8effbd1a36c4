"""Results of an evaluation on disk: written all or none (a full disk keeps the previous set),
eval.py's re-evaluation never replacing the after-training table, and eval.py's top-level
options and a task checkpoint's corpus options refused in one line before any work."""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, compose_train

from poslab.errors import ConfigError
from poslab.evaluation.compare import find_results
from poslab.evaluation.report import temporary_path, write_all_or_none, write_reports
from poslab.evaluation.run import report_rows, results_folder


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.tmp"))


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def eval_py(args: list[str], cwd: Path, file_size_limit: int | None = None):
    """Run eval.py; with `file_size_limit` no file can grow past that many bytes (RLIMIT_FSIZE:
    a write beyond it fails with EFBIG, as on a full disk; Python ignores SIGXFSZ)."""

    def limit() -> None:
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, str(REPO / "eval.py"), *args, "wandb=false"],
        cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=limit,
    )  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error")]


# ---------------------------------------------------------------- the writer, in-process


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


@contextlib.contextmanager
def file_size_limit(n: int) -> Iterator[None]:
    """In this process, no file grows past `n` bytes while the block runs (RLIMIT_FSIZE's soft
    limit, restored after): a real EFBIG, as a full disk gives ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


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


# ---------------------------------------------------------------- eval.py on a full disk


def test_eval_py_on_a_full_disk_keeps_the_previous_results(trained_runs, tmp_path):
    """The defect: a full disk turned a valid extrapolation.json into a truncated one while the
    csv/md stayed old. Now: one error line, exit 2, the old set byte for byte, no temporary."""
    run = copy_run(trained_runs["rope"][0], tmp_path / "run")
    before = contents(run / "extrapolation")
    # the checkpoint is only read; eval.log (~1 kB) fits, the new JSON (~7 kB) does not
    args = [f"run={run}", f"out_dir={run}", "eval.factors=[1,2,4]", "eval.max_tokens=1500"]
    result = eval_py(args, tmp_path, file_size_limit=4096)
    errors = error_lines(result.stderr)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith(f"error: cannot write {run / 'extrapolation/extrapolation.json'}")
    assert "the disk is full" in errors[0] and "previous results are intact" in errors[0]
    assert contents(run / "extrapolation") == before
    assert temporaries(run) == []


# ---------------------------------------------------------------- where eval.py writes


def test_eval_py_without_out_dir_keeps_the_after_training_table(trained_runs, tmp_path):
    sweep = tmp_path / "sweep"
    run = copy_run(trained_runs["rope"][0], sweep / "rope")
    before = contents(run / "extrapolation")
    args = [f"run={run}", "eval.factors=[1,2]", "eval.max_tokens=600"]
    result = eval_py([*args, "eval.rope_scaling.kind=yarn"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert contents(run / "extrapolation") == before
    (new,) = run.glob("extrapolation-*")
    assert new.name.endswith("-yarn-s-auto")
    assert f"this evaluation goes to {new}" in result.stdout
    rows = json.loads((new / "extrapolation.json").read_text())
    assert {r["scheme"] for r in rows} == {"rope + yarn s=auto"}
    assert {p.name for p in new.iterdir()} >= {"extrapolation.csv", "extrapolation.md"}
    # compare.py still finds one result per run: the after-training table, not the re-run
    assert (
        find_results([run]) == find_results([sweep]) == [run / "extrapolation/extrapolation.json"]
    )


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


# ---------------------------------------------------------------- bad input: one line


@pytest.fixture(scope="module")
def task_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny passkey run (a few steps; no evaluation after training)."""
    from poslab.training import run_training

    out = tmp_path_factory.mktemp("task") / "passkey"
    run_training(compose_train([
        "data=passkey", "pos=alibi", "model=tiny", "data.seq_len=32", "data.batch_size=8",
        "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.enable_progress_bar=false",
        "optim.warmup_steps=1", "data.val_examples=8", "logger=none", "eval.after_train=false",
    ], out))  # fmt: skip
    return out


BAD = [
    (["run={rope}", "wandb=maybe"], "wandb=maybe must be true or false"),
    (["run={rope}", "wandb=null"], "wandb=null must be true or false"),
    (["run={rope}", "out_dir=true"], "out_dir=true is not a path"),
    (["run=7"], "run=7 is a number, not a path; for a path named 7 write run=./7"),
    (["ckpt=[a,b]"], "ckpt=[a, b] is not a path"),
    (["run={rope}", "data_path=false"], "data_path=false is not a path"),
    (["run={rope},{{x: 1}}"], "run={{x: 1}} is not a path"),  # each value of a -m sweep
    (
        ["run={task}", "eval.modes=[sliding]", "eval.stride=4"],
        "eval.modes=[sliding], eval.stride=4: ",
    ),
]


def test_bad_eval_py_input_is_one_line_before_any_work(trained_runs, task_run, tmp_path):
    values = {"rope": trained_runs["rope"][0], "task": task_run}

    def case(i: int) -> tuple:
        args, _ = BAD[i]
        out = tmp_path / f"case{i}"
        return eval_py([*(a.format(**values) for a in args), f"out_dir={out}"], tmp_path), out

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(case, range(len(BAD))))
    for (args, expected), (result, out) in zip(BAD, results, strict=True):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
        assert expected.format(**values) in lines[0], (args, lines)
        assert not out.exists(), args  # nothing left behind
    task_line = results[-1][0].stderr.strip()
    assert "trained on a generated task (data=passkey)" in task_line
    assert "not by windows over a corpus split" in task_line
    assert not {"eval.log", "extrapolation"} & {p.name for p in task_run.iterdir()}
