"""The study driver (poslab.study): the plan, its arithmetic, bad input as one line before any
work, and a real study of two tiny jobs run at once, one killed midway, merged, then resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO

from poslab.study.cost import job_cost
from poslab.study.driver import main
from poslab.study.plan import PlannedJob, estimated_minutes
from poslab.study.recipe import load_study

RESULT = Path("extrapolation") / "extrapolation.json"

TINY_JOB = [
    "model=tiny",
    "data.seq_len=16",
    "data.batch_size=16",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=2",
    "trainer.precision=32-true",
    "checkpoint.every_n_steps=20",
    "optim.warmup_steps=5",
    "logger=csv",
    "eval.factors=[1,2]",
    "eval.max_tokens=1000",
]


def tiny_study(folder: Path) -> Path:
    """Two jobs of the quickstart recipe; alibi trains long enough to be killed midway."""
    path = folder / "two.yaml"
    path.write_text(
        "experiment: quickstart\n"
        "jobs:\n"
        "  rope-s1234: [pos=rope, trainer.max_steps=100]\n"
        "  alibi-s1234: [pos=alibi, trainer.max_steps=400]\n"
        "baseline: rope\n"
        "plan: {vocab_size: 100, eval_tokens: 2000, startup_s: 5}\n"
    )
    return path


def study_cmd(recipe: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "scripts" / "study.py"),
        str(recipe),
        f"data.path={corpus}",
        *TINY_JOB,
        "--out",
        str(out),
        "--device",
        "cpu",
        "--jobs-per-device",
        "2",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------
# the plan


def test_the_paper_gpu_dry_run_plans_twelve_runs_and_the_upper_bound(corpus, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["paper_gpu", f"data.path={corpus}", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "study paper_gpu: 13 jobs of experiment=paper_gpu (0 finished" in text
    for scheme in ("sinusoidal", "rope", "t5", "alibi"):
        for seed in (1234, 1, 2):
            assert f"| {scheme}-s{seed} | 512 |" in text
    assert "| sinusoidal-L8192-s1234 | 8192 |" in text
    assert "estimate: " in text and "on the recipe's reference device, one NVIDIA H100" in text
    assert not out.exists()  # a dry run writes nothing


def test_every_paper_gpu_job_is_the_papers_setup():
    from poslab.study.recipe import compose_jobs

    study = load_study("paper_gpu")
    compose_jobs(study, [])
    grid = [j for j in study.jobs if "L8192" not in j.name]
    assert len(grid) == 12 and study.baseline == "rope"
    for job in grid:
        config = job.config
        assert config["data"]["seq_len"] == 512 and config["model"]["scale_embeddings"] is True
        assert config["eval"]["modes"] == ["nonoverlapping", "sliding"]
        assert [int(f * 512) for f in config["eval"]["factors"]] == [512, 1024, 2048, 4096, 8192]
        if config["pos_name"] == "t5":
            assert config["pos"]["max_distance"] == "auto"
    (upper,) = [j for j in study.jobs if "L8192" in j.name]
    tokens = [job_cost(j.config, study.plan).train_tokens for j in (grid[0], upper)]
    assert tokens[0] == tokens[1]  # the upper bound sees as many tokens, 8,192 at a time


def test_the_flop_count_is_the_usual_one():
    """6 FLOPs per matmul parameter and token, plus causal attention 6·T·d per layer."""
    config = {
        "model": {"n_layer": 2, "n_head": 2, "d_model": 8, "d_ff": 32},
        "data": {"seq_len": 4, "batch_size": 3, "vocab_size": 10},
        "trainer": {"max_steps": 5, "val_check_interval": 5, "limit_val_batches": 1},
        "eval": {"factors": [1], "modes": ["nonoverlapping"], "max_tokens": 12},
    }
    plan = {"vocab_size": 10, "eval_tokens": 100}
    cost = job_cost(config, plan)
    matmul = 2 * (4 * 8 * 8 + 2 * 8 * 32) + 8 * 10
    assert cost.matmul_params == matmul
    assert cost.train_flops_per_token == 6 * matmul + 6 * 2 * 4 * 8
    assert cost.train_tokens == 5 * 3 * 4
    forward = 2 * matmul + 2 * 2 * 4 * 8
    assert cost.val_flops == 2 * (1 * 3 * 4) * forward  # at step 0 and step 5, one batch each
    assert cost.eval_flops == 12 * forward


def _planned(flops: float) -> PlannedJob:
    from poslab.study.cost import Cost

    cost = Cost(1, 1, 1, 1.0, flops, 0.0, 0.0, 0.0)
    return PlannedJob(job=None, cost=cost)  # type: ignore[arg-type]


def test_jobs_sharing_a_device_share_its_rate():
    # one job: its FLOPs at the full rate, after its start-up
    assert estimated_minutes([_planned(600.0)], 1, 4, 10.0, 0.0)[0] == pytest.approx(1.0)
    # four equal jobs packed on one device: the device's total work at its rate
    four = [_planned(600.0) for _ in range(4)]
    assert estimated_minutes(four, 1, 4, 10.0, 6.0)[0] == pytest.approx((6 + 240) / 60)
    # one at a time: start-up paid four times
    assert estimated_minutes(four, 1, 1, 10.0, 6.0)[0] == pytest.approx(4 * 66 / 60)
    # two devices halve it
    assert estimated_minutes(four, 2, 2, 10.0, 0.0)[0] == pytest.approx(2.0)
    # a finished job costs nothing
    done = _planned(600.0)
    done.finished = True
    assert estimated_minutes([done], 1, 1, 10.0, 6.0)[0] == 0.0


# ---------------------------------------------------------------------------------------------
# bad input: one line, exit code 2, nothing written


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nosuch"], "no study recipe 'nosuch'; choose one of: first_sweep, paper_cpu, paper_gpu"),
        (["paper_gpu", "--budget", "0.01"], "more than --budget 0.01; raise --budget"),
        (["paper_gpu", "--gpus", "7"], "--gpus 7: no such GPU on this machine"),
        (["paper_gpu", "pos=alibi"], "pos=alibi: the study's jobs set pos"),
        (["paper_gpu", "attention=nosuch"], "job sinusoidal-s1234: attention=nosuch is not an"),
        (["paper_gpu", "model.d_model=-1"], "job sinusoidal-s1234: "),
        (["paper_gpu", "trainer.max_steps"], "'trainer.max_steps' is not an override"),
        (["paper_gpu", "--time-limit", "0"], "--time-limit 0: must be > 0 minutes"),
        (["paper_gpu", "--jobs-per-device", "0"], "--jobs-per-device 0: must be ≥ 1"),
        # once accepted and dropped (#60): every job runs with resume=auto in <out>/runs/<job>/
        (["paper_gpu", "resume=/some/run"], "resume=/some/run: the study places every job"),
        (["paper_gpu", "hydra.run.dir=/x"], "hydra.run.dir=/x: the study places every job"),
    ],
)
def test_bad_input_is_one_line_before_any_work(args, expected, corpus, tmp_path, capsys):
    if "--gpus" in args and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a GPU 7")
    out = tmp_path / "study"
    with pytest.raises(SystemExit) as stop:
        main([*args, f"data.path={corpus}", "--out", str(out), "--dry-run"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("experiment: quickstart\ngrid: {pos: [rope], seed: [1, -1]}\n", "seed=-1 must be"),
        ("experiment: quickstart\ngrid: {pos: [rope, null]}\n", "grid.pos holds None"),
        (
            "experiment: quickstart\njobs: {a: [pos=rope, seed=1], b: [seed=1, pos=rope]}\n",
            "jobs a and b have the same settings",
        ),
        (
            "experiment: quickstart\ngrid: {pos: [rope]}\nbaseline: alibi\n",
            "baseline 'alibi' is no scheme of its jobs; choose one of: rope",
        ),
        ("experiment: quickstart\ngrid: {pos: [rope]}\nplan: {mfuu: 0.3}\n", "plan.mfuu is not"),
        (
            "experiment: quickstart\njobs: {a: [pos=rope, eval.after_train=false]}\n",
            "eval.after_train=false leaves no evaluation",
        ),
        (
            "experiment: quickstart\njobs: {a: [pos=rope, experiment=paper_gpu]}\n",
            "job a set experiment=, which the study sets (quickstart)",
        ),
        ("experiment: quickstart\njobs: {'a b': [pos=rope]}\n", "job name 'a b' must be"),
        ("experiment: quickstart\n", "lists no job"),
        ("experiment: quickstart\ngrid: {pos: rope}\n", "`grid:` maps options to non-empty"),
        (
            "experiment: quickstart\ngrid: {pos: [rope]}\nextra: {pos=alibi: [seed=2]}\n",
            "extra.pos=alibi matches no grid value",
        ),
        ("experiment: quickstart\ngrid: {pos: [rope]}\nextra: [a]\n", "`extra:` maps a grid"),
        ("experiment: quickstart\ngrid: {pos: [rope]}\nevals: {t: split}\n", "`evals:` maps names"),
        (
            "experiment: quickstart\ngrid: {pos: [rope]}\nevals: {t: [run=x]}\n",
            "evals.t sets run=x; the study sets run= and out_dir=",
        ),
    ],
)
def test_a_bad_study_file_is_one_line(recipe, expected, corpus, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(recipe)
    with pytest.raises(SystemExit) as stop:
        main([str(path), f"data.path={corpus}", "--out", str(tmp_path / "s"), "--dry-run"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "s").exists()


def test_a_second_driver_on_a_study_is_refused(corpus, tmp_path, capsys):
    from poslab.run.run_folder import RunLock

    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"recipe": "two", "jobs": {}}))
    held = RunLock(out)
    held.acquire()  # as a running driver holds it
    try:
        with pytest.raises(SystemExit):
            main([str(tiny_study(tmp_path)), f"data.path={corpus}", *TINY_JOB, "--out", str(out)])
    finally:
        held.release()
    assert f"another study driver (pid {os.getpid()}) is running this study in {out}" in (
        capsys.readouterr().err
    )
    assert not (out / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_free_device_is_one_line(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["paper_gpu", f"data.path={corpus}", "--device", "cuda", "--dry-run"])
    assert "--device cuda but this machine has no CUDA GPU" in capsys.readouterr().err


def test_a_study_folder_resumes_only_its_own_recipe(corpus, tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"recipe": "other", "jobs": {}}))
    with pytest.raises(SystemExit):  # --dry-run: a regression must not start the study
        main(["paper_gpu", f"data.path={corpus}", "--out", str(out), "--dry-run"])
    assert f"{out} holds the study 'other', not 'paper_gpu'" in capsys.readouterr().err
    (out / "study.json").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["paper_gpu", f"data.path={corpus}", "--out", str(out), "--dry-run"])
    assert f"--out {out} is a folder that holds no study" in capsys.readouterr().err


def test_a_study_folder_resumes_only_its_own_recipe_file(corpus, tmp_path, capsys):
    """#60: another .yaml named like the recipe that made the folder was taken for it (the
    name was all that was compared); a copy of the same file, or the file itself, resumes."""
    first, other = tmp_path / "a" / "two.yaml", tmp_path / "b" / "two.yaml"
    first.parent.mkdir()
    other.parent.mkdir()
    first.write_text(tiny_study(tmp_path).read_text())
    other.write_text(first.read_text().replace("alibi", "nope"))
    out = tmp_path / "study"
    out.mkdir()
    from poslab.study.driver import recipe_digest

    state = {"recipe": "two", "source": str(first), "source_sha256": recipe_digest(first)}
    (out / "study.json").write_text(json.dumps({**state, "jobs": {}}))
    args = [f"data.path={corpus}", *TINY_JOB, "--out", str(out), "--device", "cpu", "--dry-run"]
    with pytest.raises(SystemExit) as stop:
        main([str(other), *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out} holds the study made by {first}, not by {other}" in err[0]
    copy = tmp_path / "c" / "two.yaml"
    copy.parent.mkdir()
    copy.write_text(first.read_text())
    assert main([str(copy), *args]) == 0
    assert main([str(first), *args]) == 0


def test_a_study_of_extensions_runs_again_and_resumes(corpus, trained_runs, tmp_path, capsys):
    """#60: a job with extend=PARENT ran once, then the same command was refused ("ran with
    model_name=tiny, the study now gives model_name=${hydra:runtime.choices.model}"): the
    child's record holds the parent's architecture, which the study's composition lacked."""
    parent = trained_runs["rope"][0]
    recipe = tmp_path / "ext.yaml"
    recipe.write_text(
        "experiment: quickstart\n"
        f"jobs:\n  rope-ext: [extend={parent}, trainer.max_steps=4]\n"
        "plan: {vocab_size: 100, eval_tokens: 2000, startup_s: 5}\n"
    )
    out = tmp_path / "study"
    args = [str(recipe), f"data.path={corpus}", *TINY_JOB, "--out", str(out), "--device", "cpu"]
    assert main(args) == 0, capsys.readouterr()
    assert (out / "runs" / "rope-ext" / RESULT).is_file()
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err  # the same command: finished, skipped
    assert capsys.readouterr().err == ""


def test_a_job_resumes_only_with_the_settings_its_run_had(corpus, tmp_path, capsys):
    """A run made by another command (an edited recipe, a copied folder) would merge other
    models into a finished row with exit code 0: its own saved config is compared."""
    out = tmp_path / "study"
    saved = out / "runs" / "rope-s1" / ".hydra"
    saved.mkdir(parents=True)
    (out / "study.json").write_text(json.dumps({"recipe": "paper_gpu", "jobs": {}}))
    from poslab.study.recipe import compose_jobs

    study = load_study("paper_gpu")
    compose_jobs(study, [f"data.path={corpus}"])
    (rope,) = [j for j in study.jobs if j.name == "rope-s1"]
    options = {**rope.options, "trainer.max_steps": 50}
    nested: dict = {}
    for key, value in options.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    (saved / "config.yaml").write_text(json.dumps(nested))  # JSON is YAML
    with pytest.raises(SystemExit):
        main(["paper_gpu", f"data.path={corpus}", "--out", str(out), "--dry-run"])
    err = capsys.readouterr().err
    assert (
        f"job rope-s1: {out / 'runs' / 'rope-s1'} ran with trainer.max_steps=50, the study " in err
    )
    assert "gives trainer.max_steps=900; run the study's command as it was" in err
    options["trainer.max_steps"] = 900  # the same settings: the plan counts it as started
    nested["trainer"]["max_steps"] = 900
    (saved / "config.yaml").write_text(json.dumps(nested))
    assert main(["paper_gpu", f"data.path={corpus}", "--out", str(out), "--dry-run"]) == 0


# ---------------------------------------------------------------------------------------------
# a real study: two jobs at once, one killed midway, the merged table, the resume


@pytest.mark.slow  # starts processes
def test_two_jobs_one_killed_a_merged_table_that_names_it_then_the_resume(corpus, tmp_path):
    recipe, out = tiny_study(tmp_path), tmp_path / "study"
    alibi = out / "runs" / "alibi-s1234"
    proc = subprocess.Popen(
        study_cmd(recipe, corpus, out),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while not (alibi / "checkpoints" / "last.ckpt").exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "alibi never wrote a checkpoint"
        time.sleep(0.05)
    state = json.loads((out / "study.json").read_text())
    assert {state["jobs"][n]["state"] for n in ("rope-s1234", "alibi-s1234")} == {"running"}
    os.killpg(state["jobs"]["alibi-s1234"]["pid"], signal.SIGKILL)  # both ran at once
    printed = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, printed  # a job has no result

    assert "alibi-s1234 has no result (killed by signal 9)" in printed
    merged = (out / "comparison" / "comparison.md").read_text()
    assert "| rope |" in merged.replace("rope (1 seed)", "rope")
    assert "alibi" not in merged.split("### jobs without a result")[0]
    assert "### jobs without a result (1 of 2)" in merged
    assert "- alibi-s1234: killed by signal 9, last checkpoint at step" in merged
    resume = merged.rsplit("Resume them (finished jobs are skipped): `", 1)[1].split("`")[0]
    assert (
        resume.startswith(f"python {REPO / 'scripts' / 'study.py'} ") and f"--out {out}" in resume
    )
    summary = (out / "study.md").read_text()
    assert "| rope-s1234 | completed | 100 |" in summary
    assert "| alibi-s1234 | killed |" in summary

    # the same command again: rope is skipped, alibi continues from its checkpoint
    again = subprocess.run(
        study_cmd(recipe, corpus, out), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "(1 finished, 1 to resume, 0 to start)" in again.stdout
    assert "started alibi-s1234 (resumed)" in again.stdout
    assert "started rope-s1234" not in again.stdout
    log = (out / "logs" / "alibi-s1234.log").read_text()
    assert "resume=auto" in log and "resuming from" in log.lower()
    state = json.loads((out / "study.json").read_text())
    assert state["jobs"]["alibi-s1234"]["invocations"] == 2
    assert state["jobs"]["rope-s1234"]["invocations"] == 1
    merged = json.loads((out / "comparison" / "comparison.json").read_text())
    assert {row["scheme"] for row in merged} == {"rope", "alibi"}
    assert "jobs without a result" not in (out / "comparison" / "comparison.md").read_text()
    summary = (out / "study.md").read_text()
    assert "| alibi-s1234 | completed | 400 |" in summary


# ---------------------------------------------------------------------------------------------
# slow: the cluster path through Hydra's submitit launcher (its local variant), a time limit


@pytest.mark.slow
def test_the_submitit_launcher_runs_a_job_into_the_same_folder(corpus, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    recipe = tmp_path / "one.yaml"
    recipe.write_text(
        "experiment: quickstart\njobs:\n  rope-s1234: [pos=rope, trainer.max_steps=30]\n"
        "plan: {vocab_size: 100, eval_tokens: 2000, startup_s: 5}\n"
    )
    out = tmp_path / "study"
    command = [c for c in study_cmd(recipe, corpus, out) if c not in ("--device", "cpu")]
    command = [*command[: command.index("--jobs-per-device")], "--launcher", "submitit_local"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run = out / "runs" / "rope-s1234"
    assert json.loads((run / "status.json").read_text())["status"] == "completed"
    assert "hydra/launcher=submitit_local" in (out / "logs" / "rope-s1234.log").read_text()
    assert (out / "comparison" / "comparison.json").is_file()


@pytest.mark.slow
def test_a_time_limit_stops_the_jobs_with_checkpoints_and_says_what_is_left(corpus, tmp_path):
    recipe, out = tiny_study(tmp_path), tmp_path / "study"
    recipe.write_text(
        recipe.read_text()
        .replace("trainer.max_steps=100", "trainer.max_steps=20000")
        .replace("trainer.max_steps=400", "trainer.max_steps=20000")
    )
    result = subprocess.run(
        study_cmd(recipe, corpus, out, "--time-limit", "0.4"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # jobs are left
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"study stopped by the time limit; resume it with: python {REPO}/scripts/")
    )
    summary = (out / "study.md").read_text()
    for name in ("rope-s1234", "alibi-s1234"):
        assert f"| {name} | interrupted |" in summary
        assert f"- {name}: stopped by the time limit, last checkpoint at step" in summary
        assert (out / "runs" / name / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_devices_are_found_and_the_matmul_rate_is_measured():
    from poslab.study.devices import choose_devices, gpus, matmul_rate

    found = gpus()
    assert [d.index for d in found] == list(range(torch.cuda.device_count()))
    assert all(d.total_bytes > 2**30 and 0 <= d.used_bytes <= d.total_bytes for d in found)
    chosen = choose_devices("cuda", [0])
    assert chosen[0].kind == "cuda" and chosen[0].index == 0
    rate = matmul_rate(chosen[0], "bf16-mixed")
    assert 1e12 < rate < 1e16  # between a small GPU and no GPU made yet
    assert matmul_rate(chosen[0], "32-true") < rate  # fp32 (tf32 aside) is the slower unit


# ---------------------------------------------------------------------------------------------
# paper_cpu: the budget axis, grid extras, the study's own evaluations, chunks


def test_the_paper_cpu_dry_run_plans_sixty_jobs_and_their_cpu_hours(corpus, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["paper_cpu", f"data.path={corpus}", "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "study paper_cpu: 60 jobs of experiment=paper_cpu (0 finished" in text
    for scheme in ("sinusoidal", "rope", "t5", "alibi"):
        for seed in (1234, 1, 2, 3, 4):
            for steps in (300, 1000, 3000):
                assert f"| {scheme}-s{seed}-max_steps{steps} | 128 |" in text
    assert "job-hours: " in text and not out.exists()


def test_every_paper_cpu_job_is_the_headline_recipe_at_its_budget(corpus):
    from poslab.study.recipe import compose_jobs

    study = load_study("paper_cpu")
    # the project's own corpus: the recipe's ../shared path exists only beside a checkout
    compose_jobs(study, [f"data.path={corpus}"])
    assert study.evals == {"test": ["eval.split=test", "eval.short_context=null"]}
    budgets = set()
    for job in study.jobs:
        config = job.config
        assert config["data"]["tokenizer_version"] == 2 and config["data"]["seq_len"] == 128
        assert config["trainer"]["precision"] == config["eval"]["precision"] == "bf16-mixed"
        assert config["eval"]["modes"] == ["nonoverlapping", "sliding"]
        assert config["eval"]["short_context"] == 32 and config["eval"]["split"] == "validation"
        # the headline's sinusoid scales its embeddings; the other rows do not (as committed)
        assert config["model"]["scale_embeddings"] is (config["pos_name"] == "sinusoidal")
        budgets.add(job_cost(config, study.plan).train_tokens)
    assert sorted(budgets) == [300 * 4096, 1000 * 4096, 3000 * 4096]  # 1.2M to 12.3M: 10x


def test_the_plan_counts_the_studys_own_evaluations_and_context_use(corpus):
    study = load_study("paper_cpu")
    from poslab.study.recipe import compose_jobs

    compose_jobs(study, [f"data.path={corpus}"])
    config = study.jobs[0].config
    alone = job_cost(config, study.plan).eval_flops
    with_test = job_cost(config, study.plan, study.evals).eval_flops
    no_context = {**config, "eval": {**config["eval"], "short_context": None}}
    assert job_cost(no_context, study.plan).eval_flops < alone  # context use has a cost
    # the test split: the same lengths and modes without context use
    assert with_test == pytest.approx(alone + job_cost(no_context, study.plan).eval_flops)


def test_only_selects_a_chunk_and_a_pattern_that_matches_nothing_is_one_line(
    corpus, tmp_path, capsys
):
    args = ["paper_cpu", f"data.path={corpus}", "--out", str(tmp_path / "s"), "--dry-run"]
    assert main([*args, "--only", "*-s1234-*", "--only", "rope-s1-max_steps300"]) == 0
    text = capsys.readouterr().out
    assert "study paper_cpu: 13 jobs" in text and "| rope-s1-max_steps300 |" in text
    # a chunk without the baseline's jobs: the baseline's runs come from the other chunks
    assert main([*args, "--only", "t5-s1-max_steps1000", "--only", "alibi-s1-max_steps1000"]) == 0
    assert "study paper_cpu: 2 jobs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        main([*args, "--only", "nope-*"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only nope-* matches no job of paper_cpu" in err[0]


@pytest.mark.slow  # starts processes
def test_a_study_evaluates_every_finished_job_again_and_merges_each_evaluation(corpus, tmp_path):
    """Two tiny budgets of rope, each trained, then scored on the test split by eval.py in the
    slot it freed; both comparisons written; the same command again has nothing to do."""
    recipe = tmp_path / "budgets.yaml"
    recipe.write_text(
        "experiment: quickstart\n"
        "grid: {pos: [rope], trainer.max_steps: [10, 20]}\n"
        "extra: {trainer.max_steps=20: [optim.lr=0.002]}\n"
        "evals: {test: [eval.split=test]}\n"
        "plan: {vocab_size: 100, eval_tokens: 2000, startup_s: 5}\n"
    )
    out = tmp_path / "study"
    done = subprocess.run(
        study_cmd(recipe, corpus, out), cwd=tmp_path, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rope-max_steps10: trained in" in done.stdout and "evaluation test next" in done.stdout
    assert "started rope-max_steps10 (evaluation test)" in done.stdout
    # its completion line gives the job's whole time, training and evaluation together
    trained = float(re.search(r"rope-max_steps10: trained in ([\d.]+) min", done.stdout)[1])
    line = re.search(
        r"rope-max_steps10 completed in ([\d.]+) min \(evaluation test the last ([\d.]+)\)",
        done.stdout,
    )
    assert line, done.stdout
    assert float(line[1]) >= trained + float(line[2]) - 0.15
    for job in ("rope-max_steps10", "rope-max_steps20"):
        rows = json.loads(
            (out / "evals" / "test" / job / "extrapolation" / "extrapolation.json").read_text()
        )
        assert {r["split"] for r in rows} == {"test"}
        own = json.loads((out / "runs" / job / "extrapolation" / "extrapolation.json").read_text())
        assert {r["split"] for r in own} == {"validation"}
    log = (out / "logs" / "rope-max_steps20.log").read_text()
    assert "optim.lr=0.002" in log  # the grid value's extra came with it
    merged = (out / "comparison-test" / "comparison.md").read_text()
    assert "test split" in merged and "max_steps=10" in merged and "max_steps=20" in merged
    state = json.loads((out / "study.json").read_text())
    assert {j["state"] for j in state["jobs"].values()} == {"completed"}
    again = subprocess.run(
        study_cmd(recipe, corpus, out), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "(2 finished, 0 to resume, 0 to start)" in again.stdout

    # a chunk's results, committed without checkpoints, are read on their own: the budget axis
    from poslab.report.budget import budget_report
    from poslab.study.collect import collect

    dest = tmp_path / "committed"
    entries = collect(out, dest)
    assert sorted(e["job"] for e in entries) == ["rope-max_steps10", "rope-max_steps20"]
    assert collect(out, dest) == []  # a chunk adds, never rewrites
    import shutil

    shutil.rmtree(out)
    rows = json.loads((dest / "evals" / "test" / "rope-max_steps10" / RESULT).read_text())
    assert rows[0]["provenance"]["steps"] == 10 and rows[0]["provenance"]["vocabulary"] == 2
    assert rows[0]["provenance"]["code"].startswith(("git ", "poslab "))
    assert "thread" in rows[0]["provenance"]["machine"]  # the machine that trained it
    result = budget_report([dest / "evals" / "test"], tmp_path / "budget", "rope", "two budgets")
    assert [r["steps"] for r in result["budgets"]] == [10, 20]
    assert (tmp_path / "budget" / "budget.png").stat().st_size > 0


def test_a_row_name_keeps_every_option_but_the_length():
    """#60: a job with pos.base=500 was labelled `rope (L=128)` and pos.base appeared nowhere
    in comparison.md: only the training length is shortened."""
    from poslab.study.report import short_names

    trained = {
        "rope [data.seq_len=64]": 64,
        "alibi [data.seq_len=64]": 64,
        "rope [data.seq_len=128, pos.base=500]": 128,
        "rope [data.seq_len=64, pos.base=500]": 64,
    }
    assert short_names(trained) == {
        "rope [data.seq_len=64]": "rope",
        "alibi [data.seq_len=64]": "alibi",
        "rope [data.seq_len=128, pos.base=500]": "rope [pos.base=500] (L=128)",
        "rope [data.seq_len=64, pos.base=500]": "rope [pos.base=500]",
    }


def test_a_completed_job_without_its_result_is_told_what_helps(tmp_path):
    """#60: a finished job whose extrapolation.json was deleted was told to re-run the study,
    which skips it again (exit 1 each time): study.md now says what helps."""
    from poslab.study.report import _why_missing, missing_section

    run = tmp_path / "runs" / "rope-s1"
    run.mkdir(parents=True)
    why = _why_missing(run, {"status": "completed"}, {})
    assert "running the study again skips a completed job: restore that file" in why
    assert f"or delete {run} to train the job again" in why
    assert "Resume them" not in missing_section([("rope-s1", why)], 2, "python study.py x")
    assert "Resume them" in missing_section([("a", why), ("b", "not started")], 2, "cmd")


def test_a_chunk_without_the_baseline_says_why_its_table_has_no_differences(tmp_path, capsys):
    """The merged table of a chunk that --only left the baseline out of: no paired differences,
    and the reason is the chunk, not jobs that have not finished."""
    from conftest import result_rows, write_results

    from poslab.study.report import _compare

    alibi = write_results(tmp_path / "alibi", [{**r, "scheme": "alibi"} for r in result_rows()])
    _compare([alibi], tmp_path / "chunk", "paper_cpu", "rope", names={}, chunk=True)
    said = capsys.readouterr().out
    assert "this chunk (--only) leaves its jobs out" in said
    _compare([alibi], tmp_path / "whole", "paper_cpu", "rope", names={})
    assert "its jobs have not finished" in capsys.readouterr().out
