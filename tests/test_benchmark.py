"""scripts/benchmark.py, in-process on a tiny model: every number it reports is a positive,
finite measurement, and the report shows them with the targets' verdicts."""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch
from conftest import CONF, REPO


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        yield importlib.import_module("benchmark")
    finally:
        sys.path.remove(str(REPO / "scripts"))


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
        eval_batches=1,
        max_matmul=256,
        out="",
        command="pytest",
    )
    report = bench.run_benchmark(options)
    assert report.peak_flops > 0 and math.isfinite(report.peak_flops)
    for r in report.results:
        stats = [r.train, r.train_long, *r.eval.values()]
        values = [s.median for s in stats] + [report.mfu(r, r.train)]
        values += [r.train_mem["bytes"], r.eval_mem["bytes"]]
        assert all(math.isfinite(v) and v > 0 for v in values), (r.scheme, values)
    md = bench.render_markdown(report, explain=True)
    for heading in ("### Training at L=8", "### Evaluation", "### Targets"):
        assert heading in md
    assert "`pytest`" in md and "alibi" in md
    # every target has a verdict; the run is not the targets' conditions, and says so
    targets = bench.check_targets(report)
    assert {t.met for t in targets} <= {True, False, None}
    assert "indicative only" in md
