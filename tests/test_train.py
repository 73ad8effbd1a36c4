"""End-to-end training: real Hydra configs, real Lightning Trainer, real checkpoints and loggers."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, SCHEMES, TINY, WIKITEXT2, compose_train, train_in_process

from poslab.build import load_checkpoint
from poslab.errors import ConfigError
from poslab.training import run_training


def metrics_csv(run: Path) -> list[dict]:
    (path,) = run.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_trains_and_val_loss_falls(trained_runs, scheme):
    run, metrics = trained_runs[scheme]
    assert (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    logged = [float(r["val/loss"]) for r in metrics_csv(run) if r.get("val/loss")]
    assert len(logged) >= 3 and logged[-1] < logged[0]  # step 0, step 20, step 40
    rows = [r for r in metrics_csv(run) if r.get("train/tokens_per_s")]
    assert rows and all(float(r["train/tokens_per_s"]) > 0 for r in rows)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "learned"])
def test_checkpoint_round_trip_rebuilds_identical_model(trained_runs, scheme):
    run, _ = trained_runs[scheme]
    ckpt = run / "checkpoints" / "last.ckpt"
    model, config = load_checkpoint(ckpt)  # weights_only=True inside
    again, _ = load_checkpoint(ckpt)
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    state = {k.removeprefix("model."): v for k, v in raw["state_dict"].items()}
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    idx = torch.randint(0, model.config.vocab_size, (2, 12))
    positions = torch.arange(3, 15)
    assert torch.equal(model(idx, positions), again(idx, positions))
    assert config["pos_name"] == scheme and config["data"]["seq_len"] == 16


def test_learnable_theta_moves_and_is_logged(corpus, tmp_path):
    run = tmp_path / "learn"
    train_in_process("rope", corpus, run, ["pos.learnable_theta=true"])
    model, _ = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert isinstance(model.pos.theta, torch.nn.Parameter)
    assert not torch.equal(model.pos.theta, model.pos.theta_init)
    logged = [float(r["pos/theta_rel_change_mean"]) for r in metrics_csv(run)
              if r.get("pos/theta_rel_change_mean")]  # fmt: skip
    assert logged and logged[-1] > 0
    # the run folder has the plot of θ_i/θ_i(init) and its numbers, for the last state
    rows = list(csv.DictReader((run / "pos" / "theta.csv").open()))
    assert (run / "pos" / "theta.png").stat().st_size > 0
    assert len(rows) == model.pos.theta_init.numel() == 16  # tiny: head_dim 32, 16 pairs
    assert any(abs(float(r["ratio"]) - 1) > 1e-3 for r in rows)


def test_fixed_theta_stays_fixed(trained_runs):
    model, _ = load_checkpoint(trained_runs["rope"][0] / "checkpoints" / "last.ckpt")
    assert "theta" not in dict(model.named_parameters())
    assert torch.equal(model.pos.theta, model.pos.theta_init)


def test_bf16_mixed_on_cpu_trains(corpus, tmp_path):
    metrics = train_in_process(
        "alibi", corpus, tmp_path / "bf16",
        ["trainer.precision=bf16-mixed", "trainer.max_steps=20", "eval.after_train=false"],
    )  # fmt: skip
    assert metrics["best_val_loss"] < metrics["val/loss_initial"]


def test_logger_none_still_writes_checkpoints(corpus, tmp_path):
    metrics = train_in_process(
        "nope", corpus, tmp_path, ["logger=none", "trainer.max_steps=5", "eval.after_train=false"]
    )
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "csv").exists() and not (tmp_path / "wandb").exists()
    assert metrics["best_val_loss"] > 0


def test_token_budget_sets_steps(corpus, tmp_path):
    cfg = compose_train(
        [f"data.path={corpus}", *TINY, "train.max_tokens=4096", "eval.after_train=false"],
        tmp_path,
    )
    from poslab.training import max_steps_for

    assert max_steps_for(cfg) == 4096 // (16 * 16)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pos=learned", "pos.max_positions=8"], "pos.max_positions"),
        (["pos=rope", "pos.fraction=0.03125"], "pos.fraction"),
        (["data.path=/nonexistent/corpus"], "data.path"),
        (["data.seq_len=100000"], "data.seq_len"),
        (["pos=t5", "pos.max_distance=4"], "max_distance"),
    ],
)
def test_bad_input_raises_config_error(corpus, tmp_path, overrides, message):
    cfg = compose_train([f"data.path={corpus}", *TINY, *overrides], tmp_path)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        run_training(cfg)


def run_cli(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_cli_errors_are_one_clear_line(corpus, tmp_path):
    unknown = run_cli([str(REPO / "train.py"), "pos=nosuchscheme"], tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        f"error: pos=nosuchscheme is not an option; choose one of: {', '.join(SCHEMES)}"
    ]
    odd = run_cli(
        [str(REPO / "train.py"), f"data.path={corpus}", *TINY, "pos=rope", "pos.fraction=0.03125"],
        tmp_path,
    )
    assert odd.returncode == 2
    assert "Traceback" not in odd.stderr
    assert "error: rope rotates pairs of dims" in odd.stderr


def test_hub_unreachable_says_pass_data_path(tmp_path):
    # HF_HUB_OFFLINE=1 (set for the session) makes the hub fail at once instead of timing out
    code = (
        "from poslab.data import read_corpus\n"
        f"read_corpus('Salesforce/wikitext', 'wikitext-2-v1', None, r'{tmp_path}')\n"
    )
    result = run_cli(["-c", code], tmp_path, {"HF_HOME": str(tmp_path / "hf")})
    assert result.returncode != 0
    assert "pass data.path=DIR" in result.stderr


def test_train_py_multirun_each_job_its_own_offline_wandb_run(corpus, tmp_path):
    """`python train.py -m pos=rope,alibi`: two jobs, two W&B offline runs (chosen because no
    credentials exist), and the sweep's comparison table."""
    env = {"HOME": str(tmp_path), "NETRC": str(tmp_path / "none")}
    env_clean = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE",)}
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "pos=rope,alibi", f"data.path={corpus}",
         *[o for o in TINY if not o.startswith("logger=")], "logger=wandb",
         "trainer.max_steps=10", "eval.factors=[1,2]", "eval.modes=[nonoverlapping]",
         f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**env_clean, **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(sweep.glob("*/wandb/offline-run-*"))
    assert [r.parts[-3].split("_")[1] for r in runs] == ["rope-tiny-L16", "alibi-tiny-L16"]
    assert len({r.name.rsplit("-", 1)[1] for r in runs}) == 2  # distinct run ids
    assert all((sweep / j / "checkpoints" / "best.ckpt").is_file() for j in
               ("0_rope-tiny-L16", "1_alibi-tiny-L16"))  # fmt: skip
    table = (sweep / "comparison" / "comparison.md").read_text()
    assert "| rope |" in table and "| alibi |" in table


@pytest.mark.slow
@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/wikitext-2 not present")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_acceptance_command_on_wikitext2(scheme, tmp_path):
    """Issue #2's acceptance run on the real corpus (about a minute per scheme on 2 cores)."""
    result = run_cli(
        [str(REPO / "train.py"), f"pos={scheme}", f"data.path={WIKITEXT2}", "model=tiny",
         "data.seq_len=64", "trainer.max_steps=60", "logger=csv", "eval.after_train=false",
         f"hydra.run.dir={tmp_path}"],
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file()
    val = [float(r["val/loss"]) for r in metrics_csv(tmp_path) if r.get("val/loss")]
    assert val[-1] < val[0]


def test_scheme_parameters_get_their_own_lr_and_no_decay(corpus, tmp_path):
    train_in_process(
        "t5", corpus, tmp_path, ["optim.pos_lr_scale=10", "trainer.max_steps=3",
                                 "eval.after_train=false"],
    )  # fmt: skip
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    groups = ckpt["optimizer_states"][0]["param_groups"]
    assert [g["initial_lr"] for g in groups] == pytest.approx([3e-3, 3e-3, 3e-2])
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.0]
    assert len(groups[2]["params"]) == 1  # the T5 bias table, shared by all layers


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.precision=bf17", "trainer.precision=bf17 is not one of auto"),
        ("attention=flex", "attention=flex trains on CUDA GPUs only"),
        ("attention.block_size=0", "attention.block_size=0"),
        ("eval.max_tokens=-5", "eval.max_tokens=-5"),
        ("eval.modes=[foo]", "eval.modes=[foo] has 'foo', which is not one of nonoverlapping"),
        ("eval.lengths=[0]", "eval.lengths=[0]"),
    ],
)
def test_bad_options_fail_before_any_training(corpus, tmp_path, override, message):
    cfg = compose_train([f"data.path={corpus}", *TINY, override], tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_training(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_warmup_longer_than_the_run_is_capped():
    from poslab.lit import warmup_steps_for

    assert warmup_steps_for(100, 60) == 12  # a fifth of the run
    assert warmup_steps_for(60, 600) == 60  # a sensible warm-up is kept
    assert warmup_steps_for(5, 3) == 1
