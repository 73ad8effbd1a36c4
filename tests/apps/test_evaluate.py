"""eval.py (poslab/apps/evaluate.py): every bad input, including eval.py's own top-level options
and a task checkpoint's corpus options, is one `error: ...` line with exit code 2 before any
work, leaving nothing behind; run in-process through the `entry()` the command calls (the same
table as real processes: tests/e2e/test_bad_inputs_cli.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from bad_inputs import EVAL_BAD, case_problems, nothing_written_by_eval
from conftest import REPO, case_values, contents, contract_problems, run_in_process

from poslab.report.compare import find_results

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_table_is_not_cut_short():
    assert len(EVAL_BAD) >= 20


@pytest.mark.parametrize("case", EVAL_BAD, ids=[c.id for c in EVAL_BAD])
def test_every_bad_input_is_one_line_and_exit_code_2(
    case, request, task_run, tmp_path, monkeypatch, capfd
):
    out = tmp_path / "case"
    app_values = case_values(request, case.args + case.expected)
    result = run_in_process("eval", case.argv(app_values, out), tmp_path, monkeypatch, capfd)
    problems = case_problems(case, result, app_values, out)
    assert not problems, f"{', '.join(problems)}\n{result.stderr[-1500:]}"
    assert nothing_written_by_eval(task_run)


def test_eval_py_refuses_a_missing_checkpoint_in_a_real_process(tmp_path):
    """The fast suite's real `python eval.py` process: the command's wiring (the shim, Hydra,
    the exit code) as a user meets it."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "eval.py"), "ckpt=/no/such.ckpt", f"out_dir={out}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not contract_problems(result, "/no/such.ckpt does not exist", out), result.stderr


def test_eval_py_without_out_dir_keeps_the_after_training_table(
    trained_runs, tmp_path, monkeypatch, capfd
):
    sweep = tmp_path / "sweep"
    run = sweep / "rope"
    shutil.copytree(trained_runs["rope"][0], run)
    before = contents(run / "extrapolation")
    args = [f"run={run}", "eval.factors=[1,2]", "eval.max_tokens=600", "wandb=false"]
    result = run_in_process(
        "eval", [*args, "eval.rope_scaling.kind=yarn"], tmp_path, monkeypatch, capfd
    )
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
