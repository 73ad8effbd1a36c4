"""`python train.py extend=RUN` (poslab/run/extend.py): a new run fine-tuned from a finished
run's weights, with a train-time RoPE extension (+pos.scaling.*) that at 0 steps is exactly the
eval-time kind; its lineage in run.json and runs.py; every parent it cannot extend, one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import (
    TINY,
    child_checkpoint,
    compose_train,
    contract_problems,
    eval_cfg,
    make_corpus,
    run_in_process,
    score_checkpoint,
    train_in_process,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# the parents train at L = 16 without an evaluation: enough steps that positions matter
PARENT = ["trainer.max_steps=20", "trainer.val_check_interval=20", "eval.after_train=false"]
# tiny's heads have 32 dims: 16 rotary pairs, one LongRoPE factor each
PAIRS = 16
LONGROPE = [
    f"+pos.scaling.long_factor=[{','.join(str(1 + i / 4) for i in range(PAIRS))}]",
    f"+pos.scaling.short_factor=[{','.join(['1.0'] * PAIRS)}]",
]


@pytest.fixture(scope="module")
def parents(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished rope run and a finished alibi run (real Trainer, checkpoints on disk)."""
    root = tmp_path_factory.mktemp("parents")
    train_in_process("rope", corpus, root / "rope", PARENT)
    train_in_process("alibi", corpus, root / "alibi", ["trainer.max_steps=2", *PARENT[1:]])
    return {"rope": root / "rope", "alibi": root / "alibi"}


@pytest.fixture(scope="module")
def yarn_child(corpus: Path, parents: dict[str, Path], tmp_path_factory) -> Path:
    """A finished child of the rope parent, fine-tuned 2 steps at L = 32 with yarn s = 2."""
    child = tmp_path_factory.mktemp("children") / "yarn"
    asked = [f"extend={parents['rope']}", "data.seq_len=32", "+pos.scaling.kind=yarn"]
    train_in_process("rope", corpus, child, [*asked, "trainer.max_steps=2", *PARENT[1:]])
    return child


# every kind with a factor; dynamic_ntk too (at train time it reads the child's length as it
# reads the evaluated one: the same function of (s, T, L))
KINDS = {
    "pi": [],
    "ntk": [],
    "yarn": [],
    "llama3": [],
    "dynamic_ntk": [],
    "longrope": LONGROPE,
}


TOLERANCE = 1e-5  # nats per token


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_child_at_0_steps_scores_as_its_parent_with_the_eval_time_kind(
    kind, corpus, parents, tmp_path
):
    child_args = ["data.seq_len=64", f"+pos.scaling.kind={kind}", "+pos.scaling.factor=4"]
    ckpt = child_checkpoint(corpus, parents["rope"], [*child_args, *KINDS[kind]], tmp_path)
    extra = {o.split("=", 1)[0].split(".")[-1]: json.loads(o.split("=", 1)[1]) for o in KINDS[kind]}
    fp32 = {"precision": "32-true", "lengths": [64, 128], "modes": ["nonoverlapping", "sliding"]}
    asked = eval_cfg(**fp32)
    asked.rope_scaling.update({"kind": kind, "factor": 4, **extra})
    parent_rows = score_checkpoint(parents["rope"] / "checkpoints" / "last.ckpt", asked)
    child_rows = score_checkpoint(ckpt, eval_cfg(**fp32))
    scored = {(r["mode"], r["length"]): r["loss"] for r in parent_rows if r["status"] == "ok"}
    assert set(scored) == {(m, n) for m in asked.modes for n in (64, 128)}
    # the kind changes what the parent scores beyond the tolerance (a tiny model on the toy
    # corpus reads mostly the last few tokens, which ntk and yarn keep: by ~5e-5 there)
    plain = score_checkpoint(parents["rope"] / "checkpoints" / "last.ckpt", eval_cfg(**fp32))
    assert max(abs(r["loss"] - scored[(r["mode"], r["length"])]) for r in plain) > 2 * TOLERANCE
    for row in child_rows:
        assert row["loss"] == pytest.approx(scored[(row["mode"], row["length"])], abs=TOLERANCE)


def test_extend_fine_tunes_20_steps_records_its_parent_and_scores_to_4x(corpus, parents, tmp_path):
    from poslab.run.extend import file_sha256
    from poslab.run.runs import find_runs, runs_table

    parent = parents["rope"]
    child = tmp_path / "child"
    asked = ["data.seq_len=32", "+pos.scaling.kind=yarn", "+pos.scaling.factor=2"]
    train_in_process("rope", corpus, child, [f"extend={parent}", *asked, "trainer.max_steps=20"])
    rows = json.loads((child / "extrapolation" / "extrapolation.json").read_text())
    assert {r["length"] for r in rows if r["status"] == "ok"} == {32, 64, 128}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")
    # named in tables as what it is
    assert {r["scheme"] for r in rows} == {"rope + yarn s=2, fine-tuned from L=16"}
    settings = json.loads((child / "run.json").read_text())
    sha = file_sha256(parent / "checkpoints" / "last.ckpt")
    assert settings["parent"] == str(parent.resolve()) and settings["parent_sha256"] == sha
    # the machine that trained it, in run.json and in every row's provenance
    from poslab.model.precision import cpu_name

    assert settings["machine"].startswith(f"{cpu_name()} (") and "thread" in settings["machine"]
    assert {r["provenance"]["machine"] for r in rows} == {settings["machine"]}
    config = json.loads((child / "status.json").read_text())
    assert config["status"] == "completed" and config["step"] == 20
    from poslab.model.build import read_checkpoint

    stored = read_checkpoint(child / "checkpoints" / "last.ckpt")["hyper_parameters"]["config"]
    assert stored["pos"]["scaling"] == {"kind": "yarn", "factor": 2.0, "train_length": 16}
    assert stored["model"]["d_model"] == 64 and stored["data"]["seq_len"] == 32
    # listed with its parent: the folder and the start of its checkpoint's SHA-256
    table = runs_table(find_runs(tmp_path), tmp_path)
    row = next(line for line in table.splitlines() if line.endswith("| child |"))
    assert f"{parent.resolve()} (sha256 {sha[:12]})" in row


def test_the_fine_tuning_defaults_apply_where_the_command_line_sets_none(corpus, parents, tmp_path):
    from poslab.run.extend import FINE_TUNING, inherit_parent

    cfg = compose_train(
        ["pos=rope", f"data.path={corpus}", "model=tiny", f"extend={parents['rope']}"], tmp_path
    )
    inherit_parent(cfg)
    assert cfg.trainer.max_steps == FINE_TUNING["trainer.max_steps"]
    assert cfg.optim.warmup_steps == FINE_TUNING["optim.warmup_steps"]
    assert cfg.optim.lr == pytest.approx(3e-3 * 0.1)  # a tenth of the parent's
    assert cfg.model.d_model == 64 and "scaling" not in cfg.pos  # the parent's, no extension


def test_the_child_reads_its_parents_corpus_under_its_own_data_keys(corpus, parents, tmp_path):
    from poslab.model.build import read_checkpoint
    from poslab.run.extend import inherit_parent

    theirs = read_checkpoint(parents["rope"] / "checkpoints" / "last.ckpt")
    theirs = theirs["hyper_parameters"]["config"]["data"]
    asked = ["pos=rope", "model=tiny", f"extend={parents['rope']}", "data.seq_len=48"]
    cfg = compose_train(asked, tmp_path)  # no data.path: the default corpus is the hub's
    inherit_parent(cfg, asked)
    assert cfg.data.path == theirs["path"] == str(corpus) and cfg.data.seq_len == 48
    # a data.* key on the command line is set on top of the parent's data
    keyed = [*asked, "data.batch_size=3"]
    on_top = compose_train(keyed, tmp_path)
    inherit_parent(on_top, keyed)
    assert on_top.data.path == theirs["path"] and on_top.data.batch_size == 3
    assert on_top.data.seq_len == 48 and on_top.data.batch_size != theirs["batch_size"]
    # another data group is the command line's data, as it asked
    grouped = [*asked, "data=wikitext2"]
    named = compose_train(grouped, tmp_path)
    inherit_parent(named, grouped)
    assert named.data.get("path") != theirs["path"]


def test_a_child_at_the_default_length_is_said(corpus, parents, tmp_path, caplog):
    """#60: without data.seq_len a child trained at the data group's default (256), not its
    parent's L (16), and nothing said so."""
    from poslab.run.extend import inherit_parent

    asked = ["pos=rope", "model=tiny", f"extend={parents['rope']}", f"data.path={corpus}"]
    cfg = compose_train(asked, tmp_path)
    with caplog.at_level("WARNING", logger="poslab.run.extend"):
        inherit_parent(cfg, asked)
    said = f"the child trains at the data group's default {cfg.data.seq_len}, not the parent's 16"
    assert said in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="poslab.run.extend"):
        inherit_parent(
            compose_train([*asked, "data.seq_len=32"], tmp_path), [*asked, "data.seq_len=32"]
        )
    assert "no data.seq_len given" not in caplog.text


def unfinished(parent: Path, to: Path, status: str = "interrupted") -> Path:
    shutil.copytree(parent, to)
    (to / "status.json").write_text(json.dumps({"status": status, "step": 3}))
    return to


def without_checkpoint(parent: Path, to: Path) -> Path:
    shutil.copytree(parent, to)
    (to / "checkpoints" / "last.ckpt").unlink()
    return to


# (the child's arguments, with {rope}, {alibi}, {task}, {corpus}, {other}, {unfinished},
# {bare} filled in; the text the one error line holds)
BAD_PARENTS = [
    (["extend={unfinished}"], "that run is interrupted, not completed; finish it first"),
    (["extend={bare}"], "the run has no checkpoints/last.ckpt to start from"),
    # a SIGKILLed run (status still `running`, no lock held), a damaged last.ckpt (#60)
    (["extend={killed}"], "that run stopped unfinished (its status says running, but no"),
    (["extend={cut}"], "its checkpoints/last.ckpt is corrupt or incomplete, and extend= starts"),
    (["extend={corpus}"], "is not a run folder (no status.json)"),
    (["extend={rope}", "model.d_model=128"], "model.d_model=128 differs from the parent's"),
    (["extend={rope}", "pos=alibi"], "pos=alibi differs from the parent's pos=rope"),
    (["extend={alibi}", "+pos.scaling.kind=pi"], "not on the parent's ALiBi"),
    (["extend={mrope}", "+pos.scaling.kind=pi"], "whose rotary pairs each read one position axis"),
    (
        ["extend={child}", "+pos.scaling.kind=pi"],
        "the parent was itself fine-tuned with pos.scaling",
    ),
    (["extend={task}"], "data.path is not an option of the parent's data (data=passkey)"),
    (["extend={task}", "data=wikitext2"], "the parent trained on the task data=passkey"),
    (["extend={rope}", "data=passkey"], "the parent trained on the corpus data="),
    (["extend={rope}", "data.path={other}"], "another tokenizer than the parent's"),
    (
        # said from the configs, before the corpus is tokenized (#60)
        ["extend={rope}", "data.path={other}", "data.vocab_size=40"],
        "extend: data.vocab_size=40, but the parent trained with data.vocab_size=",
    ),
    (["+pos.scaling.kind=pi"], "pass extend=RUN"),
    (["extend={rope}", "pos.scaling.kind=pi"], "write it with a leading +: +pos.scaling.kind=pi"),
    (["extend={rope}", "+pos.scaling.train_length=8"], "it is the parent's data.seq_len"),
    (
        ["extend={rope}", "+pos.scaling.kind=pi", "+pos.scaling.factor=0.5"],
        "auto (= data.seq_len / the parent's)",
    ),
]


@pytest.mark.parametrize(
    ("args", "expected"), BAD_PARENTS, ids=[" ".join(a) for a, _ in BAD_PARENTS]
)
def test_a_parent_it_cannot_extend_is_one_line_before_any_work(
    args, expected, request, corpus, parents, task_run, tmp_path, monkeypatch, capfd
):
    values = {
        **{k: str(v) for k, v in parents.items()},
        "task": str(task_run),
        "corpus": str(corpus),
        "other": str(make_corpus(tmp_path / "other", n_train=200, seed=1)),
        "unfinished": str(unfinished(parents["rope"], tmp_path / "unfinished")),
        "bare": str(without_checkpoint(parents["rope"], tmp_path / "bare")),
    }
    if "{killed}" in args[0]:
        values["killed"] = str(unfinished(parents["rope"], tmp_path / "killed", "running"))
    if "{cut}" in args[0]:
        cut = without_checkpoint(parents["rope"], tmp_path / "cut")
        good = (parents["rope"] / "checkpoints" / "last.ckpt").read_bytes()
        (cut / "checkpoints" / "last.ckpt").write_bytes(good[: len(good) // 2])
        values["cut"] = str(cut)
    made_when_named = {  # session fixtures that train: only for the cases that name them
        "mrope": lambda: request.getfixturevalue("mrope_runs")["mrope"],
        "child": lambda: request.getfixturevalue("yarn_child"),
    }
    named = " ".join(args)
    values |= {k: str(make()) for k, make in made_when_named.items() if f"{{{k}}}" in named}
    out = tmp_path / "case"
    # a task has no data.path: its case leaves it out
    base = [*([] if "data=passkey" in args else [f"data.path={corpus}"]), *TINY, "data.seq_len=32"]
    argv = [*base, *(a.format(**values) for a in args), f"hydra.run.dir={out}"]
    result = run_in_process("train", argv, tmp_path, monkeypatch, capfd)
    problems = contract_problems(result, expected, out)
    assert not problems, f"{', '.join(problems)}\n{result.stderr[-1500:]}"


def test_the_command_names_the_child_by_its_parents_scheme_and_model(
    corpus, parents, tmp_path, monkeypatch, capfd
):
    """The run folder is named before the run starts: by the parent's pos= and model=, not by
    the defaults (rope, small) the command line would otherwise compose."""
    from poslab.run.runs import main as list_runs

    args = [f"data.path={corpus}", f"extend={parents['alibi']}", "data.seq_len=32"]
    args += ["trainer.max_steps=2", "trainer.val_check_interval=2", "logger=csv"]
    args += ["eval.after_train=false", "trainer.enable_progress_bar=false"]
    result = run_in_process("train", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    (child,) = (tmp_path / "outputs" / "runs").glob("*/*")
    assert "-alibi-tiny-L32-2steps-" in child.name
    # its .hydra/config.yaml, what compare.py reads, is what ran (Hydra's beside it)
    from omegaconf import OmegaConf

    record = OmegaConf.load(child / ".hydra" / "config.yaml")
    assert record.pos._target_.endswith(".ALiBi") and record.optim.warmup_steps == 20
    assert (child / ".hydra" / "config.composed.yaml").is_file()
    list_runs([str(tmp_path / "outputs")])
    listing = capfd.readouterr().out
    assert f"| {parents['alibi'].resolve()} (sha256 " in listing


def test_an_eval_time_kind_on_a_fine_tuned_child_is_one_line(yarn_child):
    """It would replace the kind the child was fine-tuned with, not compose with it."""
    from poslab.errors import ConfigError

    ckpt = yarn_child / "checkpoints" / "last.ckpt"
    rows = score_checkpoint(ckpt, eval_cfg(lengths=[32, 64]))  # with its own yarn: fine
    assert all(math.isfinite(r["ppl"]) for r in rows)
    asked = eval_cfg(lengths=[64])
    asked.rope_scaling.kind = "pi"
    with pytest.raises(ConfigError, match="fine-tuned with pos.scaling kind=yarn s=2.0"):
        score_checkpoint(ckpt, asked)


def test_a_resumed_child_keeps_the_lineage_it_started_with(corpus, parents, tmp_path):
    """resume= continues a child in its folder; its run.json still names the checkpoint its
    weights came from, even when the parent's last.ckpt changed since."""
    import torch

    from poslab.run.extend import file_sha256

    parent = tmp_path / "parent"
    shutil.copytree(parents["rope"], parent)
    started = file_sha256(parent / "checkpoints" / "last.ckpt")
    child = tmp_path / "child"
    asked = [f"extend={parent}", "data.seq_len=32", "+pos.scaling.kind=pi", *PARENT[2:]]
    train_in_process("rope", corpus, child, [*asked, "trainer.max_steps=2"])
    last = parent / "checkpoints" / "last.ckpt"
    changed = torch.load(last, weights_only=True)  # the parent trained on, say
    changed["global_step"] += 1
    torch.save(changed, last)
    assert file_sha256(last) != started
    train_in_process("rope", corpus, child, [*asked, "trainer.max_steps=4", f"resume={child}"])
    assert json.loads((child / "status.json").read_text())["step"] == 4
    assert json.loads((child / "run.json").read_text())["parent_sha256"] == started


@pytest.mark.parametrize("kind", ["rerope", "yarn"])
def test_an_eval_time_kind_on_a_parent_is_named_as_a_variant_not_a_fine_tuning(parents, kind):
    """eval.rope_scaling builds the same pos.scaling a child trains with; on a plain parent it
    stays the rows' eval-time variant (rerope sets it at every length, yarn beyond L)."""
    asked = eval_cfg(lengths=[16, 32])
    asked.rope_scaling.kind = kind
    rows = score_checkpoint(parents["rope"] / "checkpoints" / "last.ckpt", asked)
    names = {r["scheme"] for r in rows}
    assert len(names) == 1 and "fine-tuned" not in names.pop()
    assert all(r["scheme"].startswith(f"rope + {kind}") for r in rows)
