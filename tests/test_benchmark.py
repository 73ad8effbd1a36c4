"""poslab/bench/ (`poslab-bench`, `python scripts/benchmark.py`), in-process on a tiny model:
every number it reports is a positive, finite measurement, and the report shows them with the
targets' verdicts."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from conftest import CONF


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("poslab.bench.cli")


def test_schemes_come_from_conf_pos(bench) -> None:
    stems = {p.stem for p in (CONF / "pos").glob("*.yaml")}
    schemes = bench.available_schemes()
    assert set(schemes) == stems and schemes[0] == "nope"


@pytest.fixture
def one_thread():
    """A tiny model's steps are a few microseconds of work between thread-pool barriers: on a
    shared 2-core machine two threads then wait on each other for milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_benchmark_reports_positive_finite_numbers(bench, one_thread) -> None:
    options = bench.Options(
        model="tiny",
        seq_len=8,
        batch_size=4,
        vocab=64,
        steps=1,
        warmup=1,
        rounds=1,
        schemes=["nope", "alibi"],
        device="cpu",
        kernel_eval=True,
        eval_batches=1,
        max_matmul=256,
        out="",
        command="pytest",
    )
    report = bench.run_benchmark(options)
    assert report.peak_flops > 0 and math.isfinite(report.peak_flops)
    for r in report.results:
        stats = [r.train, r.train_long, *r.eval.values()]
        values = [s.median for s in stats] + [report.mfu(r, r.train), report.eval_mfu(r, 16)]
        values += [r.train_mem["bytes"], r.eval_mem["bytes"]]
        assert all(math.isfinite(v) and v > 0 for v in values), (r.scheme, values)
    # --attention all (the default): every other kernel that serves each scheme, timed too
    rows = {(r.scheme, r.serving) for r in report.kernel_rows}
    assert rows == {
        ("nope", "blockwise"),
        ("nope", "linear"),
        ("nope", "stick_breaking"),
        ("alibi", "blockwise"),
        ("alibi", "stick_breaking"),
    }
    for r in report.kernel_rows:
        values = [r.train.median, r.eval[16].median]  # kernel_eval=True below
        assert all(math.isfinite(v) and v > 0 for v in values), (r.scheme, r.kernel, values)
    # no model outlives the run, the kernel rows' and nope's included
    assert all(r.train_job is None for r in [*report.results, *report.kernel_rows])
    # flex serves both but has no CPU backward: listed, not timed
    assert {(u.scheme, u.kernel) for u in report.untimed} == {("nope", "flex"), ("alibi", "flex")}
    md = bench.render_markdown(report, explain=True)
    for heading in (
        "### Training at L=8",
        "### Evaluation",
        "### Every kernel that serves each scheme",
        "### Targets",
    ):
        assert heading in md
    assert "| alibi | stick_breaking |" in md and "| nope | auto → sdpa |" in md
    assert "`flex` serves nope, alibi but trains on CUDA only" in md
    assert "`pytest`" in md and "alibi" in md
    # every target has a verdict; the run is not the targets' conditions, and says so
    targets = bench.check_targets(report)
    assert {t.met for t in targets} <= {True, False, None}
    assert "indicative only" in md


def options(bench, **changes):
    """Tiny options for the checks that build no job."""
    base = dict(model="tiny", seq_len=8, vocab=64, device="cpu", out="", command="pytest")
    return bench.Options(**{**base, **changes})


def test_every_kernel_that_serves_a_scheme_is_planned(bench) -> None:
    from poslab.bench.plan import plan

    pairs, untimed = plan(options(bench, schemes=["cope", "rope", "ssmax"]))
    kernels = {(p.scheme, p.serving, p.main) for p in pairs}
    assert kernels == {
        # cope needs the scores: blockwise alone serves it, and auto picks it
        ("cope", "blockwise", True),
        ("rope", "sdpa", True),
        ("rope", "blockwise", False),
        ("rope", "linear", False),
        ("rope", "stick_breaking", False),
        # linear attention cannot take SSMax's temperature, so it is no row of ssmax
        ("ssmax", "sdpa", True),
        ("ssmax", "blockwise", False),
        ("ssmax", "stick_breaking", False),
    }
    assert [p.scheme for p in pairs if p.main] == ["cope", "rope", "ssmax"]
    assert {(u.scheme, u.kernel) for u in untimed} == {("rope", "flex"), ("ssmax", "flex")}


def test_named_kernels_must_serve_every_scheme(bench) -> None:
    from poslab.bench.plan import plan
    from poslab.errors import ConfigError

    pairs, _ = plan(options(bench, schemes=["rope"], attention=["blockwise", "sdpa", "auto"]))
    # auto picks sdpa here: one row, not two
    assert [(p.serving, p.main) for p in pairs] == [("blockwise", True), ("sdpa", False)]
    with pytest.raises(ConfigError, match="--schemes cope with --attention sdpa"):
        plan(options(bench, schemes=["rope", "cope"], attention=["sdpa"]))


def one_round(bench, schemes: list[str], on_block=None):
    """A real benchmark of `schemes` at the smallest size: one round of one step each."""
    return bench.run_benchmark(
        options(
            bench,
            batch_size=2,
            steps=1,
            warmup=1,
            rounds=1,
            schemes=schemes,
            attention=["auto"],
            eval_batches=1,
            max_matmul=256,
            memory=False,
        ),
        on_block=on_block,
    )


def test_schemes_below_target_are_profiled_against_nope(bench, one_thread, monkeypatch) -> None:
    """A real profile of one step of each, beside one of the nope of its block; the page lists
    the ops with the most extra time."""
    # every scheme below the target on paper, so that fire is profiled whatever the timings
    monkeypatch.setattr("poslab.bench.run.TARGET_VS_NOPE", 1e9)
    report = one_round(bench, ["nope", "fire"])
    nope, fire = report.results
    assert not report.kernel_rows
    assert fire.profile and fire.reference_profile
    assert nope.profile  # every run's one profiled nope step (what bounds MFU)
    assert all(ms >= 0 for ms in fire.profile.values())
    assert any("mm" in op or "linear" in op for op in fire.profile)
    md = bench.render_markdown(report)
    assert "### Why: the schemes below 0.9× nope, profiled" in md
    assert "| op | fire ms | nope ms | extra ms |" in md


def test_each_scheme_is_timed_beside_its_own_nope_and_freed(bench, one_thread) -> None:
    """Blocks: every scheme's "vs nope" divides by a nope timed in its own rounds, and no
    block's models outlive it (the nope row's block is kept for the evaluation profile, then
    freed too)."""
    pages = []
    report = one_round(bench, ["nope", "rope", "alibi"], lambda rep: pages.append(rep))
    # after each block but the last, the report so far, marked unfinished
    assert [[r.scheme for r in p.results] for p in pages] == [["nope"], ["nope", "rope"]]
    assert "- **unfinished**: 2 of 3 schemes timed so far" in bench.render_markdown(pages[1])
    assert not report.partial and "unfinished" not in bench.render_markdown(report)
    nope, rope, alibi = report.results
    assert nope.reference is None and rope.reference is not None and alibi.reference is not None
    assert rope.reference is not alibi.reference and rope.reference.samples
    assert report.reference(rope) is rope.reference and report.reference(nope) is nope.train
    assert all(r.train_job is None and r.eval_job is None for r in report.results)
    md = bench.render_markdown(report)
    ratio = rope.train.median / rope.reference.median
    assert f"| {ratio:.2f}× |" in md


def bench_target() -> float:
    from poslab.bench.configs import TARGET_VS_NOPE

    return TARGET_VS_NOPE


def test_evaluation_below_its_target_is_profiled_beside_training(
    bench, one_thread, monkeypatch
) -> None:
    """A real profile of one evaluation batch and one training step of nope, per token."""
    # evaluation below the target on paper, so that it is profiled whatever the timings
    monkeypatch.setattr("poslab.bench.run.TARGET_EVAL_OVER_TRAIN", 1e9)
    report = one_round(bench, ["nope"])
    (nope,) = report.results
    assert nope.eval_profile and nope.profile and nope.eval_profile_tokens > 0
    assert any("mm" in op or "linear" in op for op in nope.eval_profile)
    assert not any("backward" in op.lower() for op in nope.eval_profile)  # no graph in eval
    md = bench.render_markdown(report)
    assert "### Why: evaluation at 1× L against training, profiled (nope)" in md
    assert "| ops | training µs/token | evaluation µs/token | training ÷ evaluation |" in md
    assert "| all ops |" in md and "| matmuls (" in md


def test_what_bounds_mfu_is_nope_s_profiled_step_with_the_matmuls_share(bench, one_thread) -> None:
    """Every run profiles one training step of nope; the page gives the matmuls' share and the
    MFU the step would reach without the other ops (the timed MFU ÷ that share)."""
    report = one_round(bench, ["nope"])
    (nope,) = report.results
    assert nope.profile and any("backward" in op.lower() for op in nope.profile)
    md = bench.render_markdown(report)
    assert "### What bounds MFU: one training step of nope, profiled" in md
    share = sum(nope.profile.get(op, 0.0) for op in ("aten::mm", "aten::addmm", "aten::bmm"))
    share += nope.profile.get("aten::matmul", 0.0)
    share /= sum(nope.profile.values())
    assert f"The matmuls take {share:.0%} of the step" in md
    ceiling = report.mfu(nope, nope.train) / share
    assert f"would reach {ceiling:.1%}" in md


def test_the_evaluation_profile_groups_matmuls_and_adds_each_op_its_backward(bench) -> None:
    from poslab.bench.report import eval_profile_rows

    train = {
        "aten::mm": 6.0,
        "aten::addmm": 2.0,
        "aten::gelu": 1.0,
        "aten::gelu_backward": 2.0,
        "aten::add": 0.5,
    }
    evaluation = {"aten::mm": 1.0, "aten::addmm": 2.0, "aten::gelu": 1.0, "aten::copy_": 0.25}
    rows = eval_profile_rows(train, evaluation, top=1)
    assert rows[0][1:] == (8.0, 3.0)  # mm + addmm on both sides
    assert rows[1] == ("`aten::gelu`", 3.0, 1.0)  # the forward and its backward
    assert rows[2] == ("all other ops", 0.5, 0.25)
    assert rows[3] == ("all ops", 11.5, 4.25)


def test_a_job_that_fails_in_warm_up_is_left_out_and_named(bench) -> None:
    """On the first GPU run one scheme's compile error ended the whole benchmark; now that job is
    left out of the timings, named with its error, and the others run."""
    from poslab.bench.configs import scheme_config
    from poslab.bench.run import warm_up_all
    from poslab.bench.timing import TrainJob, make_setup
    from poslab.model.build import build_model

    setup = make_setup("32-true", "cpu")
    model = build_model(scheme_config("tiny", "alibi", 8, 16, "auto"), 64)
    good = TrainJob(setup, model, model.loss, 2, 8, 64, steps=1)
    bad = TrainJob(setup, model, model.loss, 2, 8, 10_000, steps=1)  # ids past the vocabulary
    bad.label = "alibi (auto), training at L=8"
    said = []
    ready, failed = warm_up_all([good, bad], 1, said.append)
    assert ready == [good] and good.first_step_s is not None
    assert len(failed) == 1 and failed[0].startswith("alibi (auto), training at L=8: IndexError")
    assert said == [f"left out, failed in warm-up: {failed[0]}"]


def test_memory_measured_in_process_is_a_number_or_a_table_cell_saying_why(bench) -> None:
    """On a GPU the peaks are measured in the benchmark's own process (a forked child cannot use
    CUDA once the parent asked it anything, which the first GPU run hit); the same code on the
    CPU: a measurement is bytes, and one that fails is its error, not a crash."""
    from poslab.bench.memory import InProcessMeasure, memory_cell

    spec = dict(
        model="tiny", scheme="alibi", seq_len=8, max_len=16, attention="auto", batch=2,
        vocab=64, precision="32-true", device="cpu", threads=1, kind="train",
    )  # fmt: skip
    measure = InProcessMeasure()
    # on a CPU an in-process peak may not grow (the process peaked earlier): a number, not > 0
    assert measure.measure(spec)["bytes"] >= 0
    failed = measure.measure({**spec, "scheme": "no_such_scheme"})
    assert "error" in failed and memory_cell(failed).startswith("failed (")
