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


def test_the_parity_report_has_its_tables_and_finite_figures(tmp_path, monkeypatch, capfd):
    """scripts/pretrained_parity.py on a reduced set (two tiny models, one kind of each family,
    one factor): every part's table, every figure a finite number within its tolerance."""
    import importlib
    import math
    import re

    out = tmp_path / "report" / "parity.md"
    args = ["--archs", "llama", "gpt2", "--kinds", "yarn", "--factors", "2", "--hooks", "rerope"]
    result = run_in_process(
        "pretrained_parity.py", [*args, "--out", str(out)], tmp_path, monkeypatch, capfd
    )
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert text in result.stdout  # printed as written
    titles = re.findall(r"^## (\S+)", text, flags=re.M)
    assert titles == ["a.", "b.", "c1.", "c2.", "d."]
    assert "transformers" in text and "torch" in text and "--factors 2" in text
    cells = [
        cell.strip()
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| model", "| setting", "| poslab"))
        for cell in line.strip("|").split("|")
    ]
    figures = [float(m) for c in cells for m in re.findall(r"^\d[\d.]*(?:e[-+]\d+)?", c)]
    assert len(figures) >= 20 and all(math.isfinite(f) for f in figures), cells
    assert re.search(r"all \d+ compared figures are within the tests. tolerances", text)
    assert "`gpt2` (no rotary): one line" in text  # GPT-2 refused as eval.py refuses it
    # without --out the report goes under outputs/, not into the committed docs
    script = importlib.import_module("poslab_pretrained_parity_script")
    assert script.DEFAULT_OUT.relative_to(script.REPO).parts[0] == "outputs"
