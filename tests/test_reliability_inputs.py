"""Bad input found before any work, said as it is: a split shorter than data.seq_len, a split file
that is a folder or a broken symlink, a checkpoint path that is a folder or a damaged file, an
eval-time RoPE scaling a multi-axis scheme refuses (named by the user's keys), and scheme or
kernel options out of range. Each is one `error: ` line, exit code 2, and no run folder left."""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import contract_problems, make_corpus, train_in_process
from test_reliability import run_case

from poslab.attention import SDPA, Auto
from poslab.build import read_checkpoint
from poslab.data import LMDataModule, TokenCache, local_split_files
from poslab.errors import ConfigError
from poslab.positions import build_scheme, scheme_configs
from poslab.positions.rope_scaling import eval_overrides
from poslab.tasks.assoc_recall import AssocRecall
from poslab.tasks.copy import Copy
from poslab.tasks.grid import Grid
from poslab.tasks.passkey import Passkey

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# a validation split of 8 tokens (7 words of the corpus' vocabulary and <eos>)
SHORT_VALID = " the a1 n1 v1 the n2 . \n"


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Corpora with one bad split each, a damaged copy of a trained run, and a random file."""
    root = tmp_path_factory.mktemp("bad_inputs")
    short = make_corpus(root / "short", n_train=200, n_valid=10)
    (short / "valid.txt").write_text(SHORT_VALID)
    vdir = make_corpus(root / "vdir", n_train=50, n_valid=10)
    (vdir / "valid.txt").unlink()
    (vdir / "valid.txt").mkdir()
    vlink = make_corpus(root / "vlink", n_train=50, n_valid=10)
    (vlink / "valid.txt").unlink()
    (vlink / "valid.txt").symlink_to(root / "missing.txt")
    tdir = make_corpus(root / "tdir", n_train=50, n_valid=10)
    (tdir / "train.txt").unlink()
    (tdir / "train.txt").mkdir()
    tempty = make_corpus(root / "tempty", n_train=50, n_valid=10)
    (tempty / "train.txt").write_text("")
    random_ckpt = root / "random.ckpt"
    random_ckpt.write_bytes(os.urandom(4096))
    return {"short": short, "vdir": vdir, "vlink": vlink, "tdir": tdir, "tempty": tempty,
            "missing": root / "missing.txt", "random": random_ckpt}  # fmt: skip


@pytest.fixture(scope="module")
def mrope_runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 4-step mrope run (best.ckpt and last.ckpt), and a copy whose last.ckpt is cut to half
    its bytes (a save or a copy that stopped part-way)."""
    root = tmp_path_factory.mktemp("mrope_runs")
    short_run = ["trainer.max_steps=4", "trainer.val_check_interval=2", "eval.after_train=false"]
    train_in_process("mrope", corpus, root / "mrope", short_run)
    shutil.copytree(root / "mrope", root / "cut")
    last = root / "cut" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return {"mrope": root / "mrope", "cut": root / "cut"}


def train_case(*overrides: str) -> tuple[str, list[str]]:
    return "train", list(overrides)


def eval_case(*overrides: str) -> tuple[str, list[str]]:
    return "eval", list(overrides)


# (case, text the one error line must hold, text it must not hold); {names} are filled per run.
# Only what needs the command line is here (each case is a process); the rest is in-process below
BAD_INPUTS = [
    (train_case("data.path={short}", "data.seq_len=512"),
     "the validation split ({short}/valid.txt) has 8 tokens, fewer than the data.seq_len=512",
     None),
    (train_case("data.path={vdir}"), "{vdir}/valid.txt is a directory, not a text file",
     "add valid.txt"),
    (train_case("data.path={vlink}"), "{vlink}/valid.txt is a broken symlink to {missing}",
     "add valid.txt"),
    (train_case("pos=mrope", "eval.rope_scaling.kind=pi"), "eval.rope_scaling.kind=pi:",
     "pos.scaling"),
    (train_case("attention.full_bias_mib=-1"), "attention.full_bias_mib=-1 must be", None),
    (train_case("pos=sandwich", "pos.dim=7"), "pos.dim=7 must be even", None),
    (eval_case("ckpt={mrope}"), "{mrope} is a directory; pass a .ckpt file", "does not exist"),
    (eval_case("ckpt={cut}/checkpoints/last.ckpt"),
     "{cut}/checkpoints/last.ckpt is corrupt or incomplete", None),
    (eval_case("run={mrope}", "eval.rope_scaling.kind=pi"), "eval.rope_scaling.kind=pi:",
     "pos.scaling"),
]  # fmt: skip


def test_bad_inputs_are_one_line_exit_code_2_and_leave_no_folder(
    corpus, bad_data, mrope_runs, tmp_path
):
    values = {"corpus": str(corpus), **{k: str(v) for k, v in {**bad_data, **mrope_runs}.items()}}
    with ThreadPoolExecutor(max_workers=3) as pool:  # the processes wait on imports mostly
        futures = [
            pool.submit(run_case, kind, overrides, values, tmp_path / f"case{i}")
            for i, ((kind, overrides), _, _) in enumerate(BAD_INPUTS)
        ]
        results = [f.result() for f in futures]
    failures = []
    for ((kind, overrides), expected, absent), (result, out) in zip(
        BAD_INPUTS, results, strict=True
    ):
        problems = contract_problems(result, expected.format(**values), out)
        if absent is not None and absent in result.stderr:
            problems.append(f"says {absent!r}")
        if problems:
            failures.append(f"{kind} {overrides}: {', '.join(problems)}\n{result.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
    # the damaged last.ckpt's line says what to do: use the intact best.ckpt beside it
    cut = next(r for ((_, args), _, _), (r, _) in zip(BAD_INPUTS, results, strict=True)
               if args[0].endswith("last.ckpt"))  # fmt: skip
    best = mrope_runs["cut"] / "checkpoints" / "best.ckpt"
    assert f"delete it and pass the checkpoint beside it instead: {best}" in cut.stderr


# ---------------------------------------------------------------------------------------------
# the same checks in-process, where no command line is needed


@pytest.mark.parametrize(
    ("scheme", "options", "expected"),
    [
        ("sandwich", {"dim": 7}, "pos.dim=7 must be even"),
        ("sandwich", {"dim": 1}, "pos.dim=1 must be an integer ≥ 2"),
        ("mrope", {"axes": 100}, "pos.axes=100 is more than the 8 rotary pairs"),
        ("mrope", {"sections": 5}, "pos.sections=5 must be a list of 3 integers"),
        ("rope2d", {"axes": 20, "axis_layout": "interleaved"}, "pos.axes=20"),
    ],
)
def test_scheme_options_out_of_range_name_their_key(scheme, options, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        build_scheme(scheme, d_model=64, n_head=4, **options)


def test_sandwich_needs_an_even_width_when_dim_follows_the_model():
    with pytest.raises(ConfigError, match=re.escape("pos.dim=null takes model.d_model=33")):
        build_scheme("sandwich", d_model=33, n_head=3)
    assert build_scheme("sandwich", d_model=64, n_head=4, dim=8).dim == 8


@pytest.mark.parametrize("kernel", [SDPA, Auto])
@pytest.mark.parametrize("value", [-1, "abc", float("nan"), True])
def test_full_bias_mib_must_be_a_size(kernel, value):
    with pytest.raises(ConfigError, match=re.escape("attention.full_bias_mib=")):
        kernel(full_bias_mib=value)


def test_full_bias_mib_takes_zero_and_fractions_of_a_mib():
    assert SDPA(full_bias_mib=0).full_bias_bytes == 0  # always per block of queries
    assert SDPA(full_bias_mib=0.5).full_bias_bytes == 2**19


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Passkey(digits=True), "data.task.digits=true"),
        (lambda: Passkey(eval_depths=0.5), "data.task.eval_depths=0.5 must be a list"),
        (lambda: Copy(symbols=True), "data.task.symbols=true"),
        (lambda: Grid(colors=True), "data.task.colors=true"),
        (lambda: Grid(shifts=[]), "data.task.shifts=[] must not be empty"),
        (lambda: AssocRecall(pairs=True), "data.task.pairs=true"),
    ],
)
def test_task_options_refuse_booleans_and_non_lists(make, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        make()


@pytest.mark.parametrize("scheme", ["mrope", "rope2d"])
def test_rope_scaling_of_a_multi_axis_scheme_names_the_eval_keys(scheme):
    pos_cfg = scheme_configs()[scheme]
    eval_cfg = {"rope_scaling": {"kind": "yarn"}, "logn_scaling": True}
    with pytest.raises(ConfigError) as err:
        eval_overrides(eval_cfg, pos_cfg, 256, 64)
    message = str(err.value)
    assert message.startswith("eval.rope_scaling.kind=yarn and eval.logn_scaling=true:")
    assert "eval.rope_scaling.kind=none" in message and "pos.scaling" not in message


def test_split_files_that_are_no_text_files_are_named_as_they_are(bad_data, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"{bad_data['vdir']}/valid.txt is a dir")):
        local_split_files(bad_data["vdir"])
    with pytest.raises(ConfigError, match=re.escape(f"broken symlink to {bad_data['missing']}")):
        local_split_files(bad_data["vlink"])
    with pytest.raises(ConfigError, match=re.escape(f"{bad_data['tdir']}/train.txt is a dir")):
        local_split_files(bad_data["tdir"])
    with pytest.raises(ConfigError, match="train.txt is empty; give it the train split's text"):
        local_split_files(bad_data["tempty"])
    device = make_corpus(tmp_path / "device", n_train=20, n_valid=5)
    (device / "valid.txt").unlink()
    (device / "valid.txt").symlink_to("/dev/null")
    with pytest.raises(ConfigError, match="valid.txt is a device, pipe or socket"):
        local_split_files(device)
    # a folder named like a split beside a real file of another accepted name: the file is used
    (device / "valid.txt").unlink()
    (device / "valid.txt").mkdir()
    (device / "validation.txt").write_text(SHORT_VALID)
    assert local_split_files(device)["validation"] == str(device / "validation.txt")


def test_a_split_shorter_than_seq_len_is_found_when_the_data_is_loaded(bad_data, tmp_path):
    def data(seq_len: int, path: Path, **options: object) -> LMDataModule:
        return LMDataModule(seq_len, batch_size=4, name="short", path=str(path),
                            cache_dir=str(tmp_path), **options)  # fmt: skip

    # vocab_size is what training reads before it builds the Trainer
    with pytest.raises(ConfigError, match=r"\(.*short/valid.txt\) has 8 tokens, fewer than"):
        data(512, bad_data["short"]).vocab_size  # noqa: B018
    held_out = data(64, bad_data["short"] / "train.txt", valid_fraction=0.001)
    with pytest.raises(ConfigError, match=r"valid_fraction=0.001 of train\) has \d+ tokens.*rai"):
        held_out.vocab_size  # noqa: B018
    assert data(7, bad_data["short"]).vocab_size > 2  # one window of 7 + 1 tokens fits


def test_token_cache_settings_that_cannot_work_fail_at_once(corpus, tmp_path):
    with pytest.raises(ConfigError, match=re.escape("data.vocab_size=100 is below the 257")):
        TokenCache("toy", path=str(corpus), tokenizer="bpe", vocab_size=100,
                   cache_dir=str(tmp_path))  # fmt: skip
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'file'} is a file, not a fold")):
        TokenCache("toy", path=str(corpus), cache_dir=str(tmp_path / "file" / "cache"))


def test_checkpoint_paths_say_what_they_are_and_what_to_pass(bad_data, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for folder in (run, run / "checkpoints"):  # what run= takes, and the folder inside it
        with pytest.raises(ConfigError, match=re.escape(f"or run={run} for its best checkpoint")):
            read_checkpoint(folder)
    link = tmp_path / "gone.ckpt"
    link.symlink_to(tmp_path / "nowhere.ckpt")
    with pytest.raises(ConfigError, match=re.escape(f"broken symlink to {tmp_path}/nowhere")):
        read_checkpoint(link)
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, run / "checkpoints" / "best.ckpt")
    last = run / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, last)
    last.write_bytes(last.read_bytes()[:5000])
    with pytest.raises(ConfigError) as err:
        read_checkpoint(last)
    assert "is corrupt or incomplete" in str(err.value)
    assert str(err.value).endswith(f"instead: {run / 'checkpoints' / 'best.ckpt'}")
    with pytest.raises(ConfigError, match="not a zip archive.*copy it again"):
        read_checkpoint(bad_data["random"])
    with pytest.raises(ConfigError, match="valid.txt as a checkpoint: it is no file torch.save"):
        read_checkpoint(bad_data["short"] / "valid.txt")
    with pytest.raises(ConfigError, match="is not a poslab checkpoint"):
        read_checkpoint(run / "checkpoints" / "best.ckpt")
