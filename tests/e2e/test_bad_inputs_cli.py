"""The bad-input tables (tests/bad_inputs.py) as real processes: `python train.py ...`, `python
eval.py ...`, `python scripts/X.py ...`. The fast suite runs the same cases in-process through
the entry functions (tests/apps/, tests/test_scripts.py); this checks that nothing between the
command line and those functions (the shims, imports at start-up, warnings on stderr) breaks the
one-line contract."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from bad_inputs import (
    EVAL_BAD,
    SCRIPT_BAD,
    TRAIN_BAD,
    case_problems,
    listing,
    nothing_written_by_eval,
    run_case_process,
)
from conftest import case_values

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def run_table(cases, values, tmp_path) -> list[str]:
    with ThreadPoolExecutor(max_workers=3) as pool:  # the processes wait on imports mostly
        futures = [
            pool.submit(run_case_process, case, values, tmp_path / f"case{i}")
            for i, case in enumerate(cases)
        ]
        results = [f.result() for f in futures]
    failures = []
    for i, (case, result) in enumerate(zip(cases, results, strict=True)):
        problems = case_problems(case, result, values, tmp_path / f"case{i}")
        if problems:
            failures.append(f"{case.id}: {', '.join(problems)}\n{result.stderr[-1500:]}")
    return failures


@pytest.mark.parametrize("table", ["train", "eval"])
def test_every_bad_input_of_train_py_and_eval_py_is_one_line_and_exit_code_2(
    table, request, task_run, tmp_path
):
    cases = TRAIN_BAD if table == "train" else EVAL_BAD
    values = {}
    for case in cases:
        values.update(case_values(request, case.args + case.expected))
    failures = run_table(cases, values, tmp_path)
    assert not failures, "\n\n".join(failures)
    assert nothing_written_by_eval(task_run)


def test_every_bad_input_of_the_scripts_is_one_line_and_exit_code_2(script_inputs, tmp_path):
    values = {k: str(v) for k, v in script_inputs.items()}
    root = script_inputs["file"].parent
    before = listing(root)
    failures = run_table(SCRIPT_BAD, values, tmp_path)
    assert not failures, "\n\n".join(failures)
    # nothing written beside the inputs either (compare's default <first path>/comparison, a
    # report under --out {results})
    assert listing(root) == before
    assert not os.listdir(tmp_path)
