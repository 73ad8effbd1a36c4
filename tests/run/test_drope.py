"""DroPE (Gelberg et al. 2026), `python train.py extend=RUN pos=nope` (poslab/run/extend.py): a
rotary parent's weights in a NoPE child, recalibrated at the parent's L; at 0 steps the child is
the parent with its rotation removed; its rows are named as DroPE; every parent it cannot drop
the positions of, one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import (
    TINY,
    child_checkpoint,
    compose_train,
    contract_problems,
    eval_cfg,
    run_in_process,
    score_checkpoint,
    train_in_process,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# the parents train at L = 16 without an evaluation
PARENT = ["trainer.max_steps=20", "trainer.val_check_interval=20", "eval.after_train=false"]
SHORT = ["trainer.max_steps=2", *PARENT[1:]]
NOPE = "poslab.positions.nope.NoPositions"


@pytest.fixture(scope="module")
def parents(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Finished runs (real Trainer, checkpoints on disk): rope (20 steps), and for the refusals
    alibi, rope with a learned θ, and a yarn child of the rope run (2 steps each)."""
    root = tmp_path_factory.mktemp("drope_parents")
    train_in_process("rope", corpus, root / "rope", PARENT)
    train_in_process("alibi", corpus, root / "alibi", SHORT)
    train_in_process("rope", corpus, root / "theta", ["pos.learnable_theta=true", *SHORT])
    yarn = [f"extend={root / 'rope'}", "data.seq_len=32", "+pos.scaling.kind=yarn", *SHORT]
    train_in_process("rope", corpus, root / "yarn", yarn)
    return {name: root / name for name in ("rope", "alibi", "theta", "yarn")}


def drope_child(corpus: Path, parent: Path, out: Path, extra: list[str] = ()) -> Path:
    """The DroPE child at 0 steps, as training builds it, saved as a checkpoint."""
    return child_checkpoint(corpus, parent, ["pos=nope", *extra], out)


def as_nope(checkpoint: Path, out: Path) -> Path:
    """The parent's checkpoint with its scheme replaced by pos=nope: its weights, unrotated."""
    import torch

    ckpt = torch.load(checkpoint, weights_only=False)
    config = ckpt["hyper_parameters"]["config"]
    config["pos"], config["pos_name"] = {"_target_": NOPE}, "nope"
    torch.save(ckpt, out)
    return out


def test_a_drope_child_at_0_steps_is_its_parent_with_the_rotation_removed(
    corpus, parents, tmp_path
):
    import torch

    from poslab.model.build import read_checkpoint

    parent_ckpt = parents["rope"] / "checkpoints" / "last.ckpt"
    child = read_checkpoint(drope_child(corpus, parents["rope"], tmp_path / "child"))
    parent = read_checkpoint(parent_ckpt)
    # every weight is the parent's: the rotary scheme had none
    assert child["state_dict"].keys() == parent["state_dict"].keys()
    assert all(torch.equal(v, parent["state_dict"][k]) for k, v in child["state_dict"].items())
    config = child["hyper_parameters"]["config"]
    assert config["pos"]["_target_"] == NOPE and config["pos_name"] == "nope"
    record = config["pos"]["drope"]
    assert record["scheme"] == "rope" and record["train_length"] == 16
    assert record["options"]["base"] == 10000.0 and "_target_" not in record["options"]
    # it scores what the parent's weights score in a pos=nope GPT, bit for bit, and not what
    # the parent scores with its rotation
    fp32 = eval_cfg(precision="32-true", lengths=[16, 64], modes=["nonoverlapping", "sliding"])
    scored = {
        (r["mode"], r["length"]): r["loss"]
        for r in score_checkpoint(tmp_path / "child" / "child.ckpt", fp32)
    }
    unrotated = score_checkpoint(as_nope(parent_ckpt, tmp_path / "nope.ckpt"), fp32)
    rotated = score_checkpoint(parent_ckpt, fp32)
    assert len(scored) == 4
    assert {(r["mode"], r["length"]): r["loss"] for r in unrotated} == scored
    # (a tiny model on the toy corpus reads mostly the last few tokens: by ~1e-3 nats there)
    gaps = [abs(r["loss"] - scored[(r["mode"], r["length"])]) for r in rotated]
    assert min(gaps) > 1e-4, gaps


def test_drope_recalibrates_at_the_parents_length_unless_told_otherwise(corpus, parents, tmp_path):
    from poslab.run.extend import FINE_TUNING, extend_arguments, inherit_parent

    rope = parents["rope"]
    args = ["pos=rope", f"data.path={corpus}", "model=tiny", f"extend={rope}", "pos=nope"]
    cfg = compose_train(args, tmp_path / "a")
    inherit_parent(cfg, asked=args)
    assert cfg.data.seq_len == 16 and cfg.pos_name == "nope" and "drope" in cfg.pos
    assert cfg.trainer.max_steps == FINE_TUNING["trainer.max_steps"]
    assert cfg.optim.lr == pytest.approx(3e-3 * 0.1)  # a tenth of the parent's, as any child
    cfg = compose_train([*args, "data.seq_len=64"], tmp_path / "b")
    inherit_parent(cfg, asked=[*args, "data.seq_len=64"])
    assert cfg.data.seq_len == 64
    # the command line gets the parent's length too, so the run folder is named by it
    argv = ["train.py", f"extend={rope}", "pos=nope"]
    assert extend_arguments(argv)[-1] == "data.seq_len=16"
    assert extend_arguments([*argv, "data.seq_len=64"])[-1] == "data.seq_len=64"
    assert extend_arguments(["train.py", f"extend={rope}"])[-1] == f"extend={rope}"


def test_a_drope_child_trains_20_steps_and_scores_to_4x_named_as_drope(
    corpus, parents, tmp_path, monkeypatch, capfd
):
    from omegaconf import OmegaConf

    from poslab.report.compare import run_options

    rope = parents["rope"]
    tiny = [a for a in TINY if not a.startswith(("data.seq_len=", "trainer.max_steps="))]
    args = [f"data.path={corpus}", *tiny, f"extend={rope}", "pos=nope", "trainer.max_steps=20"]
    result = run_in_process("train", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    (child,) = (tmp_path / "outputs" / "runs").glob("*/*")
    assert "-nope-tiny-L16-20steps-" in child.name  # at the parent's L, named by it
    rows = json.loads((child / "extrapolation" / "extrapolation.json").read_text())
    assert {r["length"] for r in rows if r["status"] == "ok"} == {16, 32, 64}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")
    assert {r["scheme"] for r in rows} == {"nope (DroPE from rope at L=16)"}
    assert json.loads((child / "status.json").read_text())["step"] == 20
    settings = json.loads((child / "run.json").read_text())
    assert settings["parent"] == str(rope.resolve()) and settings["scheme"] == "nope"
    # compare.py reads what ran: a NoPE from scratch has no pos.drope.*
    record = OmegaConf.load(child / ".hydra" / "config.yaml")
    assert record.pos._target_ == NOPE and record.data.seq_len == 16
    options = run_options(child)
    assert options["pos.drope.scheme"] == "rope" and options["pos.drope.train_length"] == 16


def test_the_row_label_names_the_dropped_scheme_and_its_length():
    from poslab.evaluation.plan import scheme_label

    record = {"scheme": "rope", "train_length": 128, "options": {"base": 10000.0}}
    config = {"pos_name": "nope", "pos": {"_target_": NOPE, "drope": record}}
    assert scheme_label(config) == "nope (DroPE from rope at L=128)"
    assert scheme_label({"pos_name": "nope", "pos": {"_target_": NOPE}}) == "nope"
    sinks = {**config, "model": {"sinks": True}}
    assert scheme_label(sinks) == "nope (DroPE from rope at L=128), sinks"


# (the child's arguments, with {rope}, {alibi}, {theta}, {yarn}, {mrope} filled in; the text
# its one error line holds)
REFUSED = [
    (["extend={alibi}", "pos=nope"], "the parent's pos=alibi (ALiBi) is not rotary"),
    (["extend={mrope}", "pos=nope"], "is over several position axes"),
    (["extend={theta}", "pos=nope"], "has trained parameters (pos.theta) that NoPE would"),
    (["extend={yarn}", "pos=nope"], "itself fine-tuned with pos.scaling kind=yarn"),
    (["extend={rope}", "pos=nope", "+pos.scaling.kind=pi"], "+pos.scaling extends a rotation"),
    (["extend={rope}", "pos=nope", "+pos.randomize_max=64"], "is not an option of pos=nope"),
    (["pos=nope", "+pos.drope.scheme=rope"], "pass extend=RUN pos=nope (DroPE) instead"),
    (["extend={rope}", "pos=alibi"], "pos=alibi differs from the parent's pos=rope"),
]


@pytest.mark.parametrize(("args", "expected"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_parent_drope_cannot_apply_to_is_one_line_before_any_work(
    args, expected, request, corpus, parents, tmp_path, monkeypatch, capfd
):
    values = {k: str(v) for k, v in parents.items()}
    if "{mrope}" in " ".join(args):  # a session fixture that trains: only where it is named
        values["mrope"] = str(request.getfixturevalue("mrope_runs")["mrope"])
    out = tmp_path / "case"
    argv = [f"data.path={corpus}", *TINY, *(a.format(**values) for a in args)]
    result = run_in_process("train", [*argv, f"hydra.run.dir={out}"], tmp_path, monkeypatch, capfd)
    problems = contract_problems(result, expected, out)
    assert not problems, f"{', '.join(problems)}\n{result.stderr[-1500:]}"


def test_a_resumed_drope_child_stays_nope_with_its_record(corpus, parents, tmp_path):
    from poslab.model.build import read_checkpoint

    child = tmp_path / "child"
    asked = [f"extend={parents['rope']}", "pos=nope", *PARENT[2:]]
    train_in_process("rope", corpus, child, [*asked, "trainer.max_steps=2"])
    train_in_process("rope", corpus, child, [*asked, "trainer.max_steps=4", f"resume={child}"])
    assert json.loads((child / "status.json").read_text())["step"] == 4
    config = read_checkpoint(child / "checkpoints" / "last.ckpt")["hyper_parameters"]["config"]
    assert config["pos"]["_target_"] == NOPE and config["pos"]["drope"]["scheme"] == "rope"
