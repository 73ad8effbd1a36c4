"""report/compare.py: runs merged into one table, the shape checks of the papers' claims."""

from __future__ import annotations

from poslab.report.compare import compare, shape_checks


def test_compare_merges_runs_into_one_table(trained_runs, tmp_path):
    rows = compare([run for run, _ in trained_runs.values()], tmp_path)
    table = (tmp_path / "comparison.md").read_text()
    # a row is named by its scheme, with what the config adds (a schedule's layer pattern)
    for scheme in trained_runs:
        assert f"| {scheme} |" in table or f"| {scheme} " in table
    assert {r["scheme"].split(" ")[0] for r in rows} == set(trained_runs)
    assert (tmp_path / "comparison_ppl.png").stat().st_size > 0
    assert (tmp_path / "comparison_loss_by_position.png").stat().st_size > 0


def test_shape_checks_follow_the_paper():
    def rows(ratios):
        out = []
        for scheme, r in ratios.items():
            for factor, ppl in ((1.0, 100.0), (8.0, 100.0 * r)):
                out.append(
                    {
                        "scheme": scheme,
                        "mode": "nonoverlapping",
                        "factor": factor,
                        "ppl": ppl,
                        "status": "ok",
                    }
                )
        return out

    good = shape_checks(rows({"sinusoidal": 5.0, "rope": 1.5, "alibi": 0.97, "t5": 1.1}))
    assert len(good) == 4 and all(line.startswith("- [x]") for line in good)
    bad = shape_checks(rows({"sinusoidal": 2.0, "rope": 1.01, "alibi": 1.2, "t5": 1.5}))
    assert all(line.startswith("- [ ]") for line in bad)


def test_context_use_differences_are_paired_by_seed():
    """Context use merged over seeds keeps each seed's value; the difference to the baseline is
    the per-seed difference's mean and t-interval (here: +0.1, +0.2, +0.3 -> 0.2 ± 0.248)."""
    from poslab.report.compare import context_differences
    from poslab.report.seeds import merge_seeds

    def runs(gains):
        return [
            (
                seed,
                [
                    {
                        "mode": "nonoverlapping",
                        "length": 128,
                        "status": "ok",
                        "ppl": 10.0,
                        "context_gain": g,
                        "key_token_share": g / 10,
                    }
                ],
            )
            for seed, g in zip((1, 2, 3), gains, strict=True)
        ]

    rows = merge_seeds(runs([0.5, 0.6, 0.7]), "alibi") + merge_seeds(runs([0.4, 0.4, 0.4]), "rope")
    text = context_differences(rows, "rope")
    assert "### difference to rope: mean gain from the long context (nats)" in text
    assert "| alibi | 3 paired | +0.200 [−0.048, +0.448]" in text
