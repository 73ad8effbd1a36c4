"""End-to-end training: real Hydra configs, real Lightning Trainer, real checkpoints and loggers."""

from __future__ import annotations

import csv
import re
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import SCHEMES, TINY, compose_train, train_in_process
from processes import folder_digest, status_of, val_losses

from poslab.errors import ConfigError
from poslab.model.build import load_checkpoint
from poslab.run.training import run_training


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
    logged = [
        float(r["pos/theta_rel_change_mean"])
        for r in metrics_csv(run)
        if r.get("pos/theta_rel_change_mean")
    ]
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
        "alibi",
        corpus,
        tmp_path / "bf16",
        ["trainer.precision=bf16-mixed", "trainer.max_steps=20", "eval.after_train=false"],
    )
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
    from poslab.run.training import max_steps_for

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


def test_scheme_parameters_get_their_own_lr_and_no_decay(corpus, tmp_path):
    train_in_process(
        "t5",
        corpus,
        tmp_path,
        ["optim.pos_lr_scale=10", "trainer.max_steps=3", "eval.after_train=false"],
    )
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
    from poslab.run.lit import warmup_steps_for

    assert warmup_steps_for(100, 60) == 12  # a fifth of the run
    assert warmup_steps_for(60, 600) == 60  # a sensible warm-up is kept
    assert warmup_steps_for(5, 3) == 1


# in-process runs: short, one precision, a checkpoint at every validation
SHORT = [*TINY, "eval.after_train=false", "trainer.precision=32-true"]


def train(corpus: Path, out: Path, *extra: str) -> dict:
    return run_training(compose_train([f"data.path={corpus}", *SHORT, *extra], out))


def test_extending_a_run_keeps_one_best_checkpoint_with_the_best_score(corpus, tmp_path):
    """A run that ended at a validation (its last.ckpt written there) is extended: the resumed
    half must know that validation's score. It used to write its best to best-v1.ckpt and keep a
    stale best.ckpt, and report the stale best_val_loss."""
    train(corpus, tmp_path, "trainer.max_steps=20", "train.validate_before_fit=false")
    # the last.ckpt written at that validation knows its score (saved before ModelCheckpoint
    # had seen it, it held no best at all)
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint")]
    ((_, first),) = val_losses(tmp_path)
    assert float(state["best_model_score"]) == pytest.approx(first, rel=1e-6)
    # what a writer killed mid-save leaves: the resumed run removes it
    (tmp_path / "checkpoints" / ".last.ckpt.4242.tmp").write_bytes(b"half a checkpoint")
    metrics = train(corpus, tmp_path, "trainer.max_steps=60", "resume=auto")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "best.ckpt",
        "last.ckpt",
    ]
    losses = val_losses(tmp_path)
    assert [step for step, _ in losses] == [19, 39, 59]  # Lightning logs step - 1
    best_step, best = min(losses, key=lambda sl: sl[1])
    assert metrics["best_val_loss"] == pytest.approx(best, rel=1e-6)
    stored = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    assert stored["global_step"] == best_step + 1
    assert status_of(tmp_path)["best_val_loss"] == pytest.approx(best, rel=1e-6)


def test_resuming_a_finished_run_changes_nothing(corpus, tmp_path):
    first = train(corpus, tmp_path, "trainer.max_steps=20")
    before = folder_digest(tmp_path)
    again = train(corpus, tmp_path, "trainer.max_steps=20", "resume=auto")
    assert folder_digest(tmp_path) == before
    assert again["best_val_loss"] == pytest.approx(first["best_val_loss"], rel=1e-9)
    assert again["val_loss_initial"] == pytest.approx(first["val/loss_initial"], rel=1e-9)


def test_a_run_stopped_before_its_first_checkpoint_starts_anew_in_its_folder(corpus, tmp_path):
    """resume=RUN of a run killed before it saved anything: it used to name eval.py's options
    (`pass ckpt=PATH or run=RUN_DIR`) and mark the run failed."""
    (tmp_path / ".hydra").mkdir()
    metrics = train(corpus, tmp_path, "trainer.max_steps=10", f"resume={tmp_path}")
    assert status_of(tmp_path)["status"] == "completed" and status_of(tmp_path)["step"] == 10
    assert metrics["best_val_loss"] > 0


def test_a_resumed_run_may_find_its_token_cache_elsewhere(corpus, tmp_path):
    """data.cache_dir says where tokens are kept (POSLAB_CACHE set in one shell, not in the
    next), not what they are: no reason to refuse a resume."""
    run = tmp_path / "run"
    train(corpus, run, "trainer.max_steps=10", f"data.cache_dir={tmp_path / 'here'}")
    train(
        corpus, run, "trainer.max_steps=20", f"data.cache_dir={tmp_path / 'there'}", "resume=auto"
    )
    assert status_of(run)["status"] == "completed" and status_of(run)["step"] == 20


@pytest.mark.parametrize("first", ["32-true", "bf16-mixed"])
def test_a_resumed_run_keeps_the_precision_it_started_with(corpus, tmp_path, first):
    """Whatever precision=auto would pick on this machine now, the second half of a run trains
    at the precision of its first half (one of the two cases differs from auto's pick here)."""
    train(corpus, tmp_path, "trainer.max_steps=10", f"trainer.precision={first}")
    train(corpus, tmp_path, "trainer.max_steps=20", "trainer.precision=auto", "resume=auto")
    stored = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert stored["global_step"] == 20
    assert stored["hyper_parameters"]["config"]["trainer"]["precision"] == first


def test_checkpoints_never_pass_through_tmpdir(corpus, tmp_path, monkeypatch):
    """Lightning's save stages each checkpoint in $TMPDIR (a 1 MiB TMPDIR failed the first one);
    poslab writes beside the checkpoint. With no usable temp folder at all, training works."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    train(corpus, tmp_path / "run", "trainer.max_steps=10")
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert not list((tmp_path / "run").rglob("*.tmp"))


@pytest.mark.parametrize(
    "option",
    ["eval.modes=[nonoverlapping,sliding]", "eval.split=test", "eval.documents={docs}"],
)
def test_corpus_only_evaluation_options_on_a_task_run_are_refused_before_training(tmp_path, option):
    """eval.py refused them on a task checkpoint; train.py took them without a word (#43)."""
    from poslab.run.validate import check_run_config

    (tmp_path / "docs.txt").write_text("a long document of words\n")
    option = option.format(docs=tmp_path / "docs.txt")
    tiny = [o for o in TINY if not o.startswith(("data.", "eval."))]
    cfg = compose_train(["data=passkey", "data.seq_len=32", *tiny, option], tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"{option}: this run trains on a generated")):
        check_run_config(cfg)


def test_an_eval_split_the_corpus_lacks_is_refused_before_training(corpus, tmp_path):
    """eval.split=test on a corpus without test.txt trained first, then stopped (#43)."""
    import shutil

    two = tmp_path / "corpus"
    two.mkdir()
    for name in ("train.txt", "valid.txt"):
        shutil.copy(corpus / name, two / name)
    cfg = compose_train([f"data.path={two}", *TINY, "eval.split=test"], tmp_path / "run")
    with pytest.raises(ConfigError, match="eval.split=test: the corpus has no test split"):
        run_training(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()
