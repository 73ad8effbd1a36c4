"""The scripts without Hydra (scripts/benchmark.py, compare.py, analysis.py): every bad input is
one `error: ...` line on stderr with exit code 2, before any slow work, and leaves nothing
behind (no output folder, no report file, nothing new beside the inputs). Run in-process through
the main() each script calls (the same table as real processes:
tests/e2e/test_bad_inputs_cli.py)."""

from __future__ import annotations

import os

import pytest
from bad_inputs import SCRIPT_BAD, case_problems, listing
from conftest import run_in_process


def test_the_table_is_not_cut_short():
    assert len(SCRIPT_BAD) >= 36


@pytest.mark.parametrize("case", SCRIPT_BAD, ids=[c.id for c in SCRIPT_BAD])
def test_every_bad_input_is_one_line_and_exit_code_2(
    case, script_inputs, tmp_path, monkeypatch, capfd
):
    values = {k: str(v) for k, v in script_inputs.items()}
    root = script_inputs["file"].parent
    before = listing(root)
    out = tmp_path / "case"
    result = run_in_process(case.app, case.argv(values, out), tmp_path, monkeypatch, capfd)
    problems = case_problems(case, result, values, out)
    assert not problems, f"{', '.join(problems)}\n{result.stderr[-1500:]}"
    assert listing(root) == before  # nothing written beside the inputs
    assert not os.listdir(tmp_path)
