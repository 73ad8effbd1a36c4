"""A study's runs in W&B (one group for its jobs, and its merged comparison logged once, as one
more run of that group, read back with W&B's own reader of the offline log), and the newcomer's
first study (first_sweep)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO
from processes import wandb_env, wandb_view


@pytest.mark.slow
def test_a_studys_jobs_share_a_wandb_group_and_its_comparison_is_logged_once(corpus, tmp_path):
    recipe, out = tmp_path / "pair.yaml", tmp_path / "pair"
    recipe.write_text(
        "experiment: quickstart\n"
        "jobs:\n"
        "  rope-s1: [pos=rope, seed=1]\n"
        "  alibi-s1: [pos=alibi, seed=1]\n"
        "baseline: rope\n"
        "plan: {vocab_size: 100, eval_tokens: 2000, startup_s: 5}\n"
    )
    command = [
        sys.executable,
        str(REPO / "scripts" / "study.py"),
        str(recipe),
        f"data.path={corpus}",
        "model=tiny",
        "data.seq_len=16",
        "trainer.max_steps=10",
        "trainer.precision=32-true",
        "logger=wandb",
        "eval.factors=[1,2]",
        "eval.max_tokens=1000",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--jobs-per-device",
        "2",
    ]
    env = wandb_env(tmp_path)
    env.pop("WANDB_RUN_GROUP", None)
    result = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for job in ("rope-s1", "alibi-s1"):
        assert wandb_view(out / "runs" / job / "wandb")[1]["run_group"] == "study-pair"
    summary, run = wandb_view(out / "wandb")
    assert run["job_type"] == "comparison" and run["run_group"] == "study-pair"
    assert summary["summary"]["comparison/rows"] == 2
    assert "logged the comparison to W&B, group study-pair" in result.stdout

    # run again with nothing new: the jobs are skipped and no second comparison run appears
    again = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1


def test_the_first_sweep_is_the_quick_start_for_rope_and_alibi_over_three_seeds(corpus):
    """docs/recipes.md's five-minute comparison: the quick start's recipe, two rows paired by
    seed against rope."""
    from poslab.study.recipe import compose_jobs, load_study

    study = load_study("first_sweep")
    compose_jobs(study, [f"data.path={corpus}"])
    assert study.baseline == "rope"
    assert sorted(job.name for job in study.jobs) == sorted(
        f"{pos}-s{seed}" for pos in ("rope", "alibi") for seed in (1, 2, 3)
    )
    for job in study.jobs:
        config = job.config
        assert config["model_name"] == "tiny" and config["data"]["seq_len"] == 64
        assert config["trainer"]["max_steps"] == 500
