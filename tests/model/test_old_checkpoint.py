"""A checkpoint written by an earlier main (tests/fixtures/main-2026-11-28/) loads and scores
the numbers that main scored, with and without eval-time extensions: the house may move, the
files users hold keep their meaning (issue #44)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import eval_cfg

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "main-2026-11-28"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_an_old_checkpoint_scores_what_it_scored(corpus, kind):
    from poslab.evaluation.run import evaluate_text, plan_checkpoint

    cfg = eval_cfg(
        factors=[1, 2, 4],
        modes=["nonoverlapping", "sliding"],
        precision="32-true",
        max_tokens=1500,
    )
    cfg.rope_scaling.kind = kind
    rows, _ = evaluate_text(plan_checkpoint(FIXTURE / "best.ckpt", cfg), None, str(corpus))
    got = [[r["mode"], r["length"], r["tokens"]] for r in rows]
    assert got == [row[:3] for row in EXPECTED[kind]]
    assert [r["ppl"] for r in rows] == pytest.approx([row[3] for row in EXPECTED[kind]], rel=1e-4)
    # the run's own tokenizer, from the checkpoint: no "rebuilt" warning path was taken
    assert rows[0]["status"] == "ok" and "other_text" not in rows[0]
