"""Generated tasks (poslab.tasks): determinism, answers where the metadata says, scoring at the
oracle and at chance, the data module's targets, and real training runs on each task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import compose_train, run_in_process
from omegaconf import OmegaConf

from poslab.errors import ConfigError
from poslab.model.losses import IGNORE_INDEX
from poslab.report.compare import compare
from poslab.tasks import TRAIN, VALIDATION, TaskDataModule, TaskExamples, example_rng, score
from poslab.tasks.assoc_recall import AssocRecall
from poslab.tasks.copy import Copy
from poslab.tasks.grid import Grid
from poslab.tasks.passkey import Passkey
from poslab.tasks.reverse import Reverse

TASKS = {
    "passkey": Passkey,
    "assoc_recall": AssocRecall,
    "copy": Copy,
    "reverse": Reverse,
    "grid": Grid,
}


def examples(task, length, n, seed=0, train=False, condition=None):
    return [task.example(length, example_rng(seed, 9, i), condition, train) for i in range(n)]


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("train", [False, True])
def test_examples_are_a_function_of_the_seed_and_have_the_length(name, train):
    task = TASKS[name]()
    a, b = examples(task, 48, 20, seed=1, train=train), examples(task, 48, 20, seed=1, train=train)
    other = examples(task, 48, 20, seed=2, train=train)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.answer, y.answer)
        assert x.tokens.shape == (49,) and x.answer.shape == (48,) and x.answer.any()
        assert x.tokens.min() >= 0 and x.tokens.max() < task.vocab_size
    assert any(not np.array_equal(x.tokens, y.tokens) for x, y in zip(a, other, strict=True))


def test_passkey_answer_is_the_key_stated_at_the_depth():
    task = Passkey(digits=5)
    statement = task.encode("the pass key is")
    for depth in (0.0, 0.5, 1.0):
        for ex in examples(task, 200, 10, condition={"depth": depth}):
            tokens = ex.tokens.tolist()
            where = next(i for i in range(len(tokens)) if tokens[i : i + 4] == statement)
            key = tokens[where + 4 : where + 9]
            assert ex.targets[ex.answer].tolist() == key
            assert all(task.tokens[t].isdigit() for t in key)
            # depth 0: the key opens the example; depth 1: it ends right before the question
            filler = 200 - task.min_length()
            assert where == round(depth * filler)
            assert ex.condition == {"depth": depth}
            assert task.decode(tokens[-11:-5]) == "what is the pass key ?"


def test_assoc_recall_answers_are_the_values_of_the_queried_keys():
    task = AssocRecall(pairs=6, queries=3)
    for ex in examples(task, 80, 20):
        tokens = ex.tokens.tolist()
        pairs = dict(zip(tokens[0:12:2], tokens[1:12:2], strict=True))
        assert len(pairs) == 6  # keys are distinct
        answer_at = np.flatnonzero(ex.answer) + 1  # token index of each answer
        for i in answer_at:
            assert tokens[i] == pairs[tokens[i - 1]]
        assert len(answer_at) == 3 and answer_at[-1] == 80


@pytest.mark.parametrize("task", [Copy(), Reverse()], ids=["copy", "reverse"])
def test_copy_and_reverse_answers_are_the_string_copied_or_reversed(task):
    for train in (False, True):
        for ex in examples(task, 41, 20, train=train):
            n = ex.condition["size"]
            source = ex.tokens[1 : n + 1]
            want = source if task.name == "copy" else source[::-1]
            assert np.array_equal(ex.targets[ex.answer], want)
            assert task.decode(ex.tokens[[0, n + 1]]) == "<bos> ="
            assert (ex.tokens[2 * n + 2 :] == 0).all()  # padding after the answer
            if not train:
                assert n == 20  # evaluation examples fill the length
    sizes = {ex.condition["size"] for ex in examples(task, 41, 200, train=True)}
    assert min(sizes) == 1 and max(sizes) == 20  # training: every size up to the length


@pytest.mark.parametrize("name", TASKS)
def test_an_oracle_scores_1_and_a_constant_predictor_scores_chance(name):
    task = TASKS[name]()
    batch = examples(task, 64, 600)
    oracle = [score(ex, ex.targets.copy()) for ex in batch]
    assert all(exact for exact, _, _ in oracle)
    assert sum(right for _, right, _ in oracle) == sum(n for _, _, n in oracle)
    constant = task.answer_symbols()[3]
    scored = [score(ex, np.full(64, constant)) for ex in batch]
    token_accuracy = sum(r for _, r, _ in scored) / sum(n for _, _, n in scored)
    exact_chance, token_chance = task.chance(batch[0])
    total = sum(n for _, _, n in scored)
    # within 4 binomial standard errors of a uniform guess's accuracy
    assert abs(token_accuracy - token_chance) < 4 * np.sqrt(token_chance / total)
    exact = np.mean([e for e, _, _ in scored])
    assert exact <= exact_chance + 4 * np.sqrt(exact_chance / len(batch)) + 1 / len(batch)


@pytest.mark.parametrize("loss_on", ["answer", "all"])
def test_targets_keep_the_answer_or_every_token_but_padding(loss_on):
    task = Copy()
    made = TaskExamples(task, 41, 30, seed=0, stream=TRAIN, loss_on=loss_on, train=True)
    for i in range(len(made)):
        inputs, targets = made[i]
        ex = made.example(i)
        assert torch.equal(inputs, torch.from_numpy(ex.tokens[:-1]))
        kept = (targets != IGNORE_INDEX).numpy()
        assert np.array_equal(kept, ex.answer if loss_on == "answer" else ~ex.padding)
        assert torch.equal(targets[kept], torch.from_numpy(ex.targets[kept]))


def test_validation_examples_are_never_training_examples():
    task = Passkey()
    train = TaskExamples(task, 64, 200, seed=3, stream=TRAIN, train=True)
    val = TaskExamples(task, 64, 200, seed=3, stream=VALIDATION)
    seen = {train.example(i).tokens.tobytes() for i in range(200)}
    assert not any(val.example(i).tokens.tobytes() in seen for i in range(200))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Passkey(digits=0), "data.task.digits=0"),
        (lambda: Passkey(eval_depths=[1.5]), "data.task.eval_depths=[1.5]"),
        (lambda: AssocRecall(pairs=4, queries=5), "keys ≥ pairs ≥ queries"),
        (lambda: Copy(symbols=40), "data.task.symbols=40"),
        (
            lambda: TaskDataModule(Passkey(), seq_len=10, batch_size=4),
            "data.seq_len=10 is too short",
        ),
        (lambda: TaskDataModule(Copy(), seq_len=32, batch_size=4, loss_on="x"), "data.loss_on=x"),
    ],
)
def test_bad_task_options_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build()


TASK_TINY = [
    "model=tiny",
    "data.seq_len=32",
    "data.batch_size=16",
    "trainer.max_steps=30",
    "trainer.val_check_interval=15",
    "trainer.enable_progress_bar=false",
    "optim.lr=3e-3",
    "optim.warmup_steps=5",
    "data.val_examples=32",
    "eval.factors=[1,2]",
    "eval.task_examples=6",
]


@pytest.mark.parametrize("name", TASKS)
def test_training_on_a_task_writes_accuracy_per_length(name, tmp_path):
    from poslab.run.training import run_training

    out = tmp_path / name
    cfg = compose_train([f"data={name}", "pos=alibi", *TASK_TINY, "logger=csv"], out)
    metrics = run_training(cfg)
    assert metrics["best_val_loss"] < metrics["val/loss_initial"]
    assert (out / "checkpoints" / "best.ckpt").is_file()
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    assert [r["length"] for r in rows] == [32, 64]
    for r in rows:
        assert r["mode"] == name and r["status"] == "ok"
        assert 0 <= r["accuracy"] <= r["token_accuracy"] <= 1 or r["accuracy"] == 0
        n_conditions = len(Passkey().eval_depths) if name == "passkey" else 1
        assert r["examples"] == 6 * n_conditions
    text = (out / "extrapolation" / "extrapolation.md").read_text()
    assert "### accuracy: the whole answer right" in text and "uniform guess" in text
    assert (out / "extrapolation" / "extrapolation_accuracy.png").stat().st_size > 0
    heatmap = out / "extrapolation" / "extrapolation_heatmap.png"
    assert heatmap.is_file() == (name == "passkey")


def test_task_runs_of_two_seeds_merge_into_mean_and_sd_with_a_heatmap(tmp_path):
    from poslab.run.training import run_training

    runs = []
    for seed in (1, 2):
        out = tmp_path / f"{seed}_alibi"
        cfg = compose_train(
            [
                "data=passkey",
                "pos=alibi",
                *TASK_TINY,
                "logger=none",
                f"seed={seed}",
                "trainer.max_steps=10",
            ],
            out,
        )
        run_training(cfg)
        # what `python train.py` leaves beside the run (compare reads the options from it)
        (out / ".hydra").mkdir()
        OmegaConf.save({k: v for k, v in cfg.items() if k != "hydra"}, out / ".hydra/config.yaml")
        runs.append(out)
    rows = compare(runs, tmp_path / "out")
    assert {r["scheme"] for r in rows} == {"alibi"}
    assert all(r["n_seeds"] == 2 and "accuracy_sd" in r for r in rows)
    assert len(rows[0]["by_condition"]) == 5
    assert (tmp_path / "out" / "comparison_heatmap.png").stat().st_size > 0
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "mean ± sample sd over 2 seeds" in text
    assert text.startswith("## passkey: accuracy vs evaluation length")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=passkey", "data.loss_on=everything"], "data.loss_on=everything"),
        (["data=passkey", "data.seq_len=12"], "data.seq_len=12 is too short for the passkey"),
        (["data=assoc_recall", "data.task.queries=20"], "keys ≥ pairs ≥ queries"),
    ],
)
def test_bad_task_input_on_the_command_line_is_one_line(
    overrides, message, tmp_path, monkeypatch, capfd
):
    out = tmp_path / "run"
    args = [*overrides, "model=tiny", "logger=none", f"hydra.run.dir={out}"]
    result = run_in_process("train", args, tmp_path, monkeypatch, capfd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- 2-D grids (data=grid)


def test_grid_cells_copy_the_row_above_shifted_and_positions_are_row_column():
    task = Grid()
    for ex in examples(task, 70, 30):  # side 8: 64 cells, 6 padding tokens
        s, shift = ex.condition["side"], ex.condition["shift"]
        assert s == 8 and shift in (-1, 0, 1)
        grid = ex.tokens[1 : s * s + 1].reshape(s, s)
        assert (ex.tokens[s * s + 1 :] == 0).all()
        answer = ex.answer[: s * s].reshape(s, s)
        # rows 0 and 1 are never answers: the shift shows only once row 1 has been read
        assert not answer[:2].any() and not ex.answer[s * s :].any()
        for r in range(1, s):
            for c in range(s):
                inside = 0 <= c - shift < s
                assert answer[r, c] == (inside and r >= 2)
                if inside:
                    assert grid[r, c] == grid[r - 1, c - shift]
        assert ex.positions[0].tolist() == [0, 0]
        assert ex.positions[1 : s * s + 1].tolist() == [
            [r + 1, c + 1] for r in range(s) for c in range(s)
        ]
        assert (ex.positions[s * s + 1 :] == 0).all()  # padding: no position past the grid
    assert task.max_position(256) == 16


def test_grid_batches_carry_positions_and_a_1d_scheme_reads_the_token_index(tmp_path):
    from poslab.run.training import run_training

    made = TaskExamples(Grid(), 64, 4, seed=0, stream=TRAIN, train=True)
    inputs, targets, positions = made[0]
    assert inputs.shape == (64,) and positions.shape == (64, 2)
    for scheme in ("rope2d", "rope", "learned"):
        out = tmp_path / scheme
        overrides = ["data=grid", f"pos={scheme}", *TASK_TINY, "data.seq_len=64", "logger=none"]
        cfg = compose_train([*overrides, "eval.factors=[1,4]"], out)
        run_training(cfg)
        rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
        assert [r["length"] for r in rows] == [64, 256]
        # a 1-D table reads the token index: 256 tokens are past its 64 rows, a skipped length
        want = "skipped" if scheme == "learned" else "ok"
        assert rows[1]["status"].startswith(want), rows[1]["status"]
    compare([tmp_path / "rope2d", tmp_path / "rope", tmp_path / "learned"], tmp_path / "out")
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "### accuracy" in text and "ALiBi paper's shape" not in text


def test_a_scheme_with_other_position_axes_than_the_data_is_one_line(tmp_path):
    from poslab.run.validate import check_run_config

    cfg = compose_train(["data=grid", "pos=mrope", "pos.axes=3", "model=tiny"], tmp_path)
    with pytest.raises(
        ConfigError,
        match="pos=mrope takes 3 position axes but data=grid gives 2 per token; set pos.axes=2",
    ):
        check_run_config(cfg)


# ---------------------------------------------------------------- images (data=image)


def make_images(folder, n_train=6, n_test=3, size=24):
    """A folder of PNGs the test makes (diagonal stripes of random period), train/ and test/."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        (folder / split).mkdir(parents=True)
        for i in range(n):
            period = rng.integers(3, 8)
            r, c = np.indices((size, size))
            level = (((r + c) // period) % 2 * 255).astype(np.uint8)
            rgb = np.stack([level, 255 - level, level], axis=-1)
            Image.fromarray(rgb).save(folder / split / f"{i}.png")
    return folder


def test_image_grids_are_read_through_datasets_and_quantised(tmp_path):
    from poslab.tasks.image import ImageGrid

    task = ImageGrid(str(make_images(tmp_path / "imgs")), levels=2)
    assert len(task.images["train"]) == 6 and len(task.images["heldout"]) == 3
    ex = task.example(64, example_rng(0, 0, 64, 0), train=True)
    assert ex.condition == {"side": 8} and ex.answer.sum() == 64
    colours = set(task.decode(ex.tokens[1:]).split())
    assert colours <= {"rgb2", "rgb5"}  # (1,0,1) and (0,1,0) of the 2-level palette
    assert ex.positions[1:].tolist() == [[r + 1, c + 1] for r in range(8) for c in range(8)]
    flat = ImageGrid(str(tmp_path / "imgs" / "train"), holdout=3)  # one flat folder
    assert len(flat.images["train"]) == 4 and len(flat.images["heldout"]) == 2


def test_training_on_images_evaluates_larger_grids(tmp_path):
    from poslab.run.training import run_training

    folder = make_images(tmp_path / "imgs")
    out = tmp_path / "run"
    cfg = compose_train(
        [
            "data=image",
            f"data.task.path={folder}",
            "pos=rope2d",
            *TASK_TINY,
            "data.seq_len=36",
            "logger=none",
            "eval.factors=[1,4]",
        ],
        out,
    )
    metrics = run_training(cfg)
    assert metrics["best_val_loss"] < metrics["val/loss_initial"]
    rows = json.loads((out / "extrapolation" / "extrapolation.json").read_text())
    got = [(r["length"], r["mode"], r["status"]) for r in rows]
    assert got == [(36, "image", "ok"), (144, "image", "ok")]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=image"], "data.task.path has no value and needs one; pass data.task.path=VALUE"),
        (["data=image", "data.task.path=/no/such/images"], "data.task.path=/no/such/images is not"),
    ],
)
def test_bad_image_input_is_one_line(overrides, message, tmp_path, monkeypatch, capfd):
    result = run_in_process(
        "train",
        [
            *overrides,
            "pos=rope2d",
            "model=tiny",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        monkeypatch,
        capfd,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr[-2000:]
