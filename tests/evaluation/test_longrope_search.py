"""LongRoPE's factor search (poslab/evaluation/longrope_search.py) on a tiny trained rope run
(L = 16, searched at T = 64): the factors keep the paper's constraints, the search never ends
worse than its best seed, a seed gives the same search, its file is read back by
eval.rope_scaling.kind=longrope (factors_file=) with the perplexity it reported, and bad input
is one line with nothing written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import eval_cfg

from poslab.errors import ConfigError
from poslab.evaluation.longrope_search import FILE, SearchSettings, main, objective_tokens
from poslab.evaluation.perplexity import score
from poslab.evaluation.plan import plan_checkpoint
from poslab.model.precision import AUTOCAST_DTYPE

TARGET = 64
# a tiny search: 4 seeds and mutations, 2 generations of 2 + 2 children, 2 windows of 64
SMALL = ["--population", "4", "--parents", "3", "--mutations", "2", "--crossovers", "2"]
SMALL += ["--generations", "2", "--samples", "2", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def searched(trained_runs, tmp_path_factory):
    """Two searches of the rope run with one seed, and one with another."""
    run, _ = trained_runs["rope"]
    root = tmp_path_factory.mktemp("longrope")
    records = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        out = root / name
        main([str(run), "--target", str(TARGET), "--out", str(out), *SMALL, "--seed", str(seed)])
        records[name] = json.loads((out / FILE).read_text())
    return run, root, records


def test_the_factors_keep_the_papers_constraints_and_the_best_seed_is_never_beaten(searched):
    _, _, records = searched
    record = records["a"]
    long, short = np.array(record["long_factor"]), record["short_factor"]
    pairs = 64 // 2 // 2  # model=tiny: d_model 64, 2 heads, R = head_dim = 32
    assert len(long) == len(short) == pairs
    assert short == [1.0] * pairs
    assert np.all(long >= 1.0) and np.all(np.diff(long) >= 0)  # non-decreasing over the pairs
    assert np.all(long <= record["settings"]["max_factor"] + 1e-9)
    assert record["settings"]["max_factor"] == pytest.approx(1 + TARGET / 16)
    # on the grid of step 0.01
    assert np.allclose(np.round((long - 1) / 0.01) * 0.01 + 1, long)
    # elitism: the best never rises from generation to generation, and ends at most the best
    # seed's perplexity (PI, NTK, YaRN)
    curve = record["best_by_generation"]
    assert len(curve) == 3 and all(b <= a for a, b in zip(curve, curve[1:], strict=False))
    assert set(record["seeds"]) == {"pi", "ntk", "yarn"}
    assert record["perplexity"] == curve[-1] <= min(record["seeds"].values())
    assert math.isfinite(record["perplexity"])
    assert record["objective"]["split"] == "train" and record["objective"]["windows"] == 2
    assert record["candidates_scored"] >= 4 and "--target" in record["command"]


def test_a_seed_gives_the_same_search(searched):
    _, _, records = searched
    a, b, c = records["a"], records["b"], records["c"]
    for key in ("long_factor", "best_by_generation", "seeds", "perplexity"):
        assert a[key] == b[key], key
    assert a["seeds"] == c["seeds"]  # the seeds do not depend on the random seed
    assert c["settings"]["seed"] == 1


def test_the_file_is_read_by_the_eval_time_kind_and_gives_the_perplexity_found(searched):
    run, root, records = searched
    path = root / "a" / FILE
    cfg = eval_cfg(lengths=[TARGET], device="cpu")
    cfg.rope_scaling.kind = "longrope"
    cfg.rope_scaling.factors_file = str(path)
    plan = plan_checkpoint(records["a"]["checkpoint"], cfg)
    # the model's config holds the lists read from the file, not its path
    scaling = plan.overrides_at[TARGET]["scaling"]
    assert scaling["factors_file"] is None
    assert scaling["long_factor"] == records["a"]["long_factor"]
    tokens, first = objective_tokens(plan, SearchSettings(target=TARGET, samples=2))
    assert first == records["a"]["objective"]["first_token"]
    assert plan.precision == records["a"]["objective"]["precision"]  # eval.precision=auto
    autocast = AUTOCAST_DTYPE[plan.precision]
    model = plan.models[TARGET]
    result = score(model, tokens, TARGET, autocast_dtype=autocast, progress=False)
    assert result.ppl == pytest.approx(records["a"]["perplexity"], rel=1e-6)


def test_a_file_with_the_lists_given_too_or_without_them_is_one_line(tmp_path):
    from poslab.positions.rope_scaling import eval_variant_options

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"long_factor": [1.0, 2.0], "short_factor": [1.0, 1.0]}))
    both = {"kind": "longrope", "factors_file": str(good), "long_factor": [1.0, 2.0]}
    with pytest.raises(ConfigError, match="both give"):
        eval_variant_options(eval_cfg(rope_scaling=both))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"long_factor": [1.0]}))
    for path, expected in ((bad, "has no short_factor"), (tmp_path / "none.json", "cannot read")):
        options = {"kind": "longrope", "factors_file": str(path)}
        with pytest.raises(ConfigError, match=expected):
            eval_variant_options(eval_cfg(rope_scaling=options))


BAD = [
    (["--target", "16"], "not past the run's training length L = 16"),
    (["--target", "64", "--parents", "5", "--population", "4"], "--parents 5"),
    (["--target", "64", "--population", "2"], "--population 2"),
    (["--target", "64", "--step", "0"], "--step"),
    (["--target", "64", "--max-factor", "2"], "below s = T/L = 4"),
    (["--target", "64", "--samples", "100000"], "fewer than --samples"),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(argv, expected, trained_runs, tmp_path, capfd):
    run, _ = trained_runs["rope"]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        main([str(run), *argv, "--out", str(out), "--quiet"])
    err = capfd.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert expected in err[0] and not out.exists()


def test_a_run_without_rotary_pairs_and_an_out_holding_the_file_are_one_line(
    searched, trained_runs, tmp_path, capfd
):
    alibi, _ = trained_runs["alibi"]
    _, root, _ = searched
    for run, out, expected in ((alibi, tmp_path / "o", "not a rotary scheme"),):
        with pytest.raises(SystemExit):
            main([str(run), "--target", "64", "--out", str(out), "--quiet"])
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and not out.exists(), err
    rope, _ = trained_runs["rope"]
    before = (root / "a" / FILE).read_text()
    with pytest.raises(SystemExit):
        main([str(rope), "--target", "64", "--out", str(root / "a"), "--quiet"])
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds" in err[0]
    assert (root / "a" / FILE).read_text() == before


def test_extend_records_the_files_lists_in_the_childs_scaling(searched):
    """+pos.scaling.factors_file=PATH at train time (extend=): the child's pos.scaling holds the
    lists read from the file (its checkpoint never needs the file), as eval's model does."""
    from poslab.positions.rope_scaling import scaling_options, train_scaling_options

    _, root, records = searched
    given = train_scaling_options({"kind": "longrope", "factors_file": str(root / "a" / FILE)})
    rotary = {"_target_": "poslab.positions.rope.Rotary"}
    scaling = scaling_options(given, rotary, TARGET, 16, train_time=True)
    assert scaling["factors_file"] is None and scaling["factor"] == TARGET / 16
    assert scaling["long_factor"] == records["a"]["long_factor"]
    assert scaling["short_factor"] == records["a"]["short_factor"]


def test_a_scheme_with_pairs_that_never_turn_gets_finite_non_decreasing_seeds(
    trained_runs, tmp_path, capfd
):
    """p_rope's slowest pairs have θ = 0 (0/0 as a ratio): they take the factor before them."""
    run, _ = trained_runs["p_rope"]
    main([str(run), "--target", str(TARGET), "--out", str(tmp_path), *SMALL])
    record = json.loads((tmp_path / FILE).read_text())
    long = np.array(record["long_factor"])
    assert np.all(np.isfinite(long)) and np.all(np.diff(long) >= 0) and np.all(long >= 1)
    assert all(math.isfinite(v) for v in record["seeds"].values())
    assert record["perplexity"] <= min(record["seeds"].values())
