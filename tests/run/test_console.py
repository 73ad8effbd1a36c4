"""What a run prints and how runs are found (poslab/run/console.py, poslab/run/runs.py): a line per
log_every_n_steps, Lightning's messages once and without small talk, run names that tell runs
apart, `outputs/latest`, `scripts/runs.py`, report headers that say what was scored."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, compose_train, make_corpus, train_in_process

from poslab.run.console import progress_bar_setting, quiet_libraries
from poslab.run.runs import find_runs, runs_table


def test_a_training_run_logs_a_line_every_log_every_n_steps(corpus, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="poslab.run.training"):
        train_in_process("rope", corpus, tmp_path / "run", ["trainer.log_every_n_steps=10"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" |")[0] for line in lines] == [f"step {n}/40" for n in (10, 20, 30, 40)]
    pattern = (
        r"step \d+/40 \| loss \d+\.\d{4} \| lr \d\.\d\de-\d\d \| \d+ ms/step \| [\d.]+k? tok/s"
    )
    assert all(re.fullmatch(pattern, line) for line in lines), lines


def test_lightning_speaks_once_through_the_root_handler_and_without_small_talk(capsys):
    import lightning.pytorch  # noqa: F401  (adds its own handler on import)

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stdout)
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        quiet_libraries()
        rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("💡 Tip: try installing something")
        rank_zero.info("TPU available: False, using: 0 TPU cores")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out = capsys.readouterr()
    assert (out.out + out.err).count("GPU available") == 1
    assert "Tip" not in out.out + out.err and "TPU" not in out.out + out.err


def test_a_progress_bar_only_on_a_terminal():
    assert progress_bar_setting(True) is True and progress_bar_setting(False) is False
    assert progress_bar_setting("auto") is sys.stderr.isatty()  # pytest's stderr: not a terminal


def test_run_names_carry_data_scheme_model_length_steps_and_seed(corpus, tmp_path):
    cfg = compose_train(
        ["pos=alibi", "data=passkey", "model=tiny", "trainer.max_steps=300", "seed=7"], tmp_path
    )
    assert cfg.run_name == "passkey-alibi-tiny-L64-300steps-s7"
    cfg = compose_train(["pos=rope", f"data.path={corpus}", "train.max_tokens=2000000"], tmp_path)
    assert cfg.run_name.endswith("-rope-small-L256-2Mtok-s1234")


def test_runs_are_listed_newest_first_with_their_settings_and_numbers(trained_runs):
    trained_runs["alibi"], trained_runs["rope"]  # noqa: B018 (both trained: alibi first)
    runs = find_runs(trained_runs["rope"][0].parent)
    names = {r.folder.name for r in runs}
    assert {"rope", "alibi"} <= names
    table = runs_table(runs, trained_runs["rope"][0].parent)
    row = next(line for line in table.splitlines() if line.endswith("| rope |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "completed" and cells[3] == "rope" and cells[4] == "tiny"
    assert cells[5] == "16" and cells[6] == "40/40" and cells[7] == "1234"
    assert float(cells[9]) > 1 and cells[10].endswith("(4x)")
    assert int(cells[11]) >= 1  # its evaluations: after training, and any eval.py of it since
    started = [r.started for r in runs]
    assert started == sorted(started, reverse=True)


@pytest.mark.slow  # starts processes: 20-30 s of the fast suite
def test_a_run_under_outputs_is_pointed_at_by_outputs_latest_and_listed(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", n_train=300, n_valid=40)
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "pos=nope",
        f"data.path={corpus}",
        "model=tiny",
        "data.seq_len=16",
        "data.batch_size=8",
        "trainer.max_steps=4",
        "trainer.val_check_interval=4",
        "logger=csv",
        "eval.after_train=false",
    ]
    env = {**os.environ, "POSLAB_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    latest = tmp_path / "outputs" / "latest"
    assert latest.is_symlink() and (latest / "status.json").is_file()
    assert latest.resolve().name.split("_", 1)[1].startswith("wikitext2-nope-tiny-L16-4steps-s1234")
    # the console when it is a file: no progress bar, no line twice
    lines = result.stderr.splitlines() + result.stdout.splitlines()
    assert not any("it/s" in line for line in lines), lines
    messages = [line.split("] - ", 1)[-1] for line in lines if "] - " in line]
    assert len(messages) == len(set(messages)), messages
    # no long silence: each validation is announced (step 0) or reported when it ends
    assert any(
        m.startswith("validation at step 0, the loss training starts from") for m in messages
    )
    assert any(
        re.match(r"validation at step 4: val/loss \d+\.\d{4} \(\d+ s\)$", m) for m in messages
    )
    listing = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "runs.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    assert "| completed | wikitext2 | nope | tiny | 16 | 4/4 | 1234 |" in listing.stdout


def test_a_report_says_what_was_scored(trained_runs):
    text = (trained_runs["rope"][0] / "extrapolation" / "extrapolation.md").read_text()
    first = text.splitlines()[2]
    assert re.search(
        r"validation split \([\d,]+ tokens scored; capped at 1,500 \(eval\.max_tokens\); "
        r"precision (32-true|bf16-mixed); sliding stride L/2\)",
        first,
    ), first


def test_a_cap_larger_than_the_split_reads_as_the_whole_split(trained_runs, tmp_path):
    """eval.max_tokens above the split's size cut nothing: the report says the whole split was
    scored, not that it was capped."""
    from conftest import eval_cfg

    from poslab.evaluation.run import evaluate_checkpoint

    run = trained_runs["rope"][0]
    rows = evaluate_checkpoint(
        str(run / "checkpoints" / "best.ckpt"),
        eval_cfg(max_tokens=10**9, factors=[1], modes=["nonoverlapping"]),
        out_dir=str(tmp_path),
    )
    assert all(r["max_tokens"] is None for r in rows)
    first = (tmp_path / "extrapolation" / "extrapolation.md").read_text().splitlines()[2]
    assert "the whole split" in first and "capped" not in first, first


def test_the_listing_counts_every_evaluation_of_a_run(tmp_path):
    """eval.py never overwrites: a re-evaluation is a folder of its own, and the listing counts
    the run's evaluation folders."""
    run = tmp_path / "run"
    for name in ("extrapolation", "extrapolation-2026-11-26_10-00-00-yarn"):
        (run / name).mkdir(parents=True)
        (run / name / "extrapolation.json").write_text("[]")
    (run / "status.json").write_text('{"status": "completed"}')
    (runs,) = find_runs(tmp_path)
    assert runs.evaluations == ["extrapolation", "extrapolation-2026-11-26_10-00-00-yarn"]
    assert runs.cells(tmp_path)[11] == "2"


def test_runs_that_differ_in_an_option_are_told_apart(tmp_path, capsys):
    """The θ ablation's three runs were listed identically ("rope small 128 30/30 seed 1"): the
    command line's options that no column shows are listed beside them."""
    from poslab.run.runs import main

    options = {"fixed": [], "learned": ["pos.learnable_theta=true"], "base": ["pos.base=500"]}
    for name, extra in options.items():
        run = tmp_path / name
        (run / ".hydra").mkdir(parents=True)
        overrides = ["pos=rope", "seed=1", "trainer.max_steps=30", *extra, "logger=csv"]
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        (run / "run.json").write_text('{"scheme": "rope", "model": "small", "seq_len": 128}')
        (run / "status.json").write_text('{"status": "completed", "step": 30}')
    main([str(tmp_path)])
    rows = {line.rsplit("|", 2)[-2].strip(): line for line in capsys.readouterr().out.splitlines()}
    assert "| 1 |  |" not in rows["learned"] and "pos.learnable_theta=true" in rows["learned"]
    assert "pos.base=500" in rows["base"] and "logger" not in rows["base"]
    assert len({line.split("|")[9] for line in (rows[n] for n in options)}) == 3


def test_runs_py_help_shows_its_examples_one_per_line():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "runs.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0
    assert sum(line.startswith("poslab-runs") for line in lines) == 3, result.stdout


@pytest.mark.parametrize("last", ["-3", "0"])
def test_runs_py_refuses_a_count_of_runs_below_one(last, tmp_path):
    """`runs.py DIR --last -3` listed nothing with exit code 0 (#43)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "runs.py"), str(tmp_path), "--last", last],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: argument --last: must be ≥ 1 (got {last}); see python scripts/runs.py --help"
    )


def test_a_run_whose_status_is_cut_short_is_listed_saying_so(tmp_path):
    """It was dropped, with "no runs (a run folder holds status.json)" (#43)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text('{"status": "compl')
    (listed,) = find_runs(tmp_path)
    assert listed.status["status"] == "unreadable status.json"
    assert "unreadable status.json" in runs_table([listed], tmp_path)
