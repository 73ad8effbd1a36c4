"""poslab/bench/generation.py (`poslab-bench-generation`, scripts/benchmark_generation.py), in
process on the tiny model: a run fills every column with real measurements, the cached and the
recomputed generations give the same tokens, and a bad option is one line before any work."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.bench import generation as gen
from poslab.bench.timing import make_setup


@pytest.fixture
def one_thread():
    """A tiny model's steps are microseconds of work between thread-pool barriers: on a shared
    2-core machine two threads wait on each other (as tests/test_benchmark.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(**changes) -> gen.GenOptions:
    base = dict(model="tiny", prompt=5, new_tokens=4, rounds=2, vocab=64, out="", command="pytest")
    return gen.GenOptions(**{**base, "precisions": ["32-true"], **changes})


def test_a_tiny_run_fills_every_column(one_thread) -> None:
    report = gen.run_generation(tiny(schemes=["rope", "xpos"]))
    rows = {(r.scheme, r.precision): r for r in report.rows}
    assert list(rows) == [("rope", "32-true"), (gen.PEER, "32-true"), ("xpos", "32-true")]
    rope, peer, xpos = rows.values()
    for stat in (rope.cached, rope.recomputed, peer.cached, xpos.recomputed):
        assert len(stat.samples) == 2 and all(math.isfinite(v) and v > 0 for v in stat.samples)
    assert rope.problem is None and rope.agreement == "identical"
    # xpos reads the forward's length: no cache, and the table says why
    assert xpos.cached is None and "reads_length" in xpos.problem
    assert peer.params > 0 and rope.params > 0
    md = gen.render_markdown(report)
    header = next(line for line in md.splitlines() if line.startswith("| scheme |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns == [
        "scheme",
        "precision",
        "cache tok/s",
        "cache ms/token",
        "no cache tok/s",
        "no cache ms/token",
        "cache ÷ no cache",
        "cache = no cache (tokens)",
        f"cache ÷ {gen.PEER}",
    ]
    assert "| `xpos` | 32-true | no cache | no cache |" in md
    assert "- `xpos` keeps no key/value cache: pos=XPos" in md
    assert "LlamaForCausalLM" in md and "`pytest`" in md and "**CPU**" in md


def test_the_default_schemes_add_every_scheme_without_a_cache() -> None:
    schemes = gen.resolved_schemes(tiny())
    assert schemes[: len(gen.CORE_SCHEMES)] == list(gen.CORE_SCHEMES)
    assert {"xpos", "ssmax", "path_attn", "grape"} <= set(schemes[len(gen.CORE_SCHEMES) :])


def test_auto_that_resolves_to_an_asked_precision_is_timed_once() -> None:
    setups = gen.setups_of(tiny(precisions=["32-true", "32-true", "auto"]))
    names = [s.precision for s in setups]
    assert names[0] == "32-true" and len(names) == len(set(names)) <= 2


@pytest.mark.parametrize("scheme", ["nope", "rope", "alibi", "t5", "fox", "learned"])
def test_cached_and_recomputed_greedy_tokens_are_the_same(scheme, one_thread) -> None:
    options = tiny(prompt=6, new_tokens=10)
    setup = make_setup("32-true", "cpu")
    model = gen.build(options, scheme)
    prompt = torch.randint(0, options.vocab, (1, options.prompt))
    tokens = [
        gen.timed(gen.poslab_job(model, prompt, options.new_tokens, setup, cached), setup)[1]
        for cached in (True, False)
    ]
    assert tokens[0].shape == (1, options.new_tokens)
    assert gen.agreement(*tokens, setup, scheme) == "identical"


def test_tokens_that_differ_stop_the_run_at_fp32_and_are_reported_at_bf16() -> None:
    a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 9, 4]])
    with pytest.raises(AssertionError, match="rope at fp32: .* from new token 3 of 4: 3 against 9"):
        gen.agreement(a, b, make_setup("32-true", "cpu"), "rope")
    cell = gen.agreement(a, b, make_setup("bf16-mixed", "cpu"), "rope")
    assert cell == "differ from token 3 (not asserted at bf16-mixed)"


BAD = [
    (["--schemes", "rope", "foo"], "argument --schemes: invalid choice: 'foo'"),
    (["--model", "huge"], "argument --model: invalid choice: 'huge'"),
    (["--prompt", "0"], "argument --prompt: must be ≥ 1 (got 0)"),
    (["--new-tokens", "-3"], "argument --new-tokens: must be ≥ 1 (got -3)"),
    (["--rounds", "two"], "argument --rounds: 'two' is not a whole number"),
    (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["--device", "tpu"], "argument --device: 'tpu' is not a device"),
    (["--out", "{file}/gen.md"], "{file} is a file, so no file"),
]
if not torch.cuda.is_available():
    BAD.append((["--device", "cuda"], "this machine has no CUDA GPU that torch can use"))


@pytest.mark.parametrize("args, expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_option_is_one_line_before_any_work(args, expected, tmp_path, capsys) -> None:
    file = tmp_path / "file"
    file.write_text("not a folder\n")
    args = [a.format(file=file) for a in args]
    out = tmp_path / "out" / "gen.md"
    with pytest.raises(SystemExit) as stop:
        gen.main(["--model", "tiny", "--schemes", "nope", "--out", str(out), *args])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert expected.format(file=file) in lines[0] and "Traceback" not in captured.err
    assert captured.out == "" and not out.parent.exists()
