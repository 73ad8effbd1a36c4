"""Reliability of a run's folder: a resumed run keeps its best model, score and precision; a
refused command never writes to the run it names; one training process per run folder;
checkpoints are written inside their own folder, and a full disk is one line with the last good
checkpoint intact. (Signals: tests/test_reliability.py.)"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY, compose_train
from test_reliability import RESUMABLE, start_and_wait_for_checkpoint, status_of

from poslab.callbacks import write_atomically
from poslab.errors import DiskFull
from poslab.training import run_training

# in-process runs: short, one precision, a checkpoint at every validation
SHORT = [*TINY, "eval.after_train=false", "trainer.precision=32-true"]


def train(corpus: Path, out: Path, *extra: str) -> dict:
    return run_training(compose_train([f"data.path={corpus}", *SHORT, *extra], out))


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file of a folder and its content hash: 'unchanged' means byte for byte."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def val_losses(folder: Path) -> list[tuple[int, float]]:
    """(step, val/loss) of every validation the CSV logger recorded, across resumes."""
    rows = []
    for path in sorted(folder.glob("csv/**/metrics.csv")):
        with open(path) as f:
            rows += [(int(r["step"]), float(r["val/loss"])) for r in csv.DictReader(f)
                     if r.get("val/loss")]  # fmt: skip
    return rows


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
    train(corpus, run, "trainer.max_steps=20", f"data.cache_dir={tmp_path / 'there'}",
          "resume=auto")  # fmt: skip
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


def _limit_file_size(limit: int):  # noqa: ANN202 -- a preexec_fn
    # writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ): a real "no room"
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_write_with_no_room_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"the last good checkpoint")
    script = (
        "import sys; from pathlib import Path; from poslab.callbacks import write_atomically\n"
        "from poslab.errors import DiskFull\n"
        "try: write_atomically(Path(sys.argv[1]), b'x' * 100_000)\n"
        "except DiskFull as err: print(err); sys.exit(2)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True,
                            text=True, timeout=60, preexec_fn=_limit_file_size(50_000))  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout.startswith(f"no room to write {target} (0.1 MiB needed")
    assert target.read_bytes() == b"the last good checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    # and with room, the same call replaces the file
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert issubclass(DiskFull, ValueError)  # a ConfigError: one line, exit code 2


# ---------------------------------------------------------------------------------------------
# processes: refusals, the lock, a full disk, a read-only folder


def train_argv(corpus: Path, folder: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), f"data.path={corpus}", *RESUMABLE,
            "logger=csv", *extra, f"hydra.run.dir={folder}"]  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """Bad input before any work: one stderr line, `error: ...`, exit code 2."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


def last_error_line(result: subprocess.CompletedProcess) -> str:
    """A failure once training runs (Lightning's own INFO lines came before it): exit code 2,
    the last line `error: ...`, the only such line, and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines[-1].startswith("error: "), result.stderr[-3000:]
    assert sum(line.startswith("error: ") for line in lines) == 1
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


@pytest.mark.slow
def test_a_refused_command_never_writes_to_the_run_it_names(corpus, tmp_path):
    run = tmp_path / "run"
    made = subprocess.run(train_argv(corpus, run, "trainer.max_steps=20"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    before = folder_digest(run)
    cases = [
        (["pos=alibi"], "pos._target_"),
        (["model.d_model=128"], "model.d_model (64 -> 128) differs"),
        (["data.seq_len=32"], "data.seq_len (16 -> 32) differs"),
        (["optim.lr=-1"], "optim.lr=-1"),
        # passes poslab's checks, refused by lightning.Trainer: still before the run is touched
        (["+trainer.gradient_clip_algorithm=foo"], "gradient_clip_algorithm` foo is invalid"),
    ]
    for extra, expected in cases:
        result = subprocess.run(
            [sys.executable, str(REPO / "train.py"), f"resume={run}", *extra],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert expected in one_error_line(result)
        assert folder_digest(run) == before, extra  # status, .hydra, log: as they were
    # a finished run resumed: nothing to do, nothing written
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={run}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert folder_digest(run) == before
    # and the run still resumes (its record was not overwritten by the refused commands)
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={run}",
                             "trainer.max_steps=50"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert status_of(run)["status"] == "completed" and status_of(run)["step"] == 50


@pytest.mark.slow
def test_a_second_process_on_a_run_folder_is_refused_with_the_holders_pid(corpus, tmp_path):
    folder = tmp_path / "run"
    proc = start_and_wait_for_checkpoint(train_argv(corpus, folder), folder)
    try:
        before = {k: v for k, v in folder_digest(folder).items() if k.startswith(".hydra")}
        result = subprocess.run(
            [sys.executable, str(REPO / "train.py"), f"resume={folder}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        line = one_error_line(result)
        assert f"in use by another training process (pid {proc.pid})" in line
        assert not (folder / ".hydra-pending").exists()
        assert {k: v for k, v in folder_digest(folder).items() if k.startswith(".hydra")} == before
    finally:
        proc.kill()
        proc.wait()
    # the killed holder's lock went with it: the run resumes
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={folder}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.slow
def test_no_room_for_a_checkpoint_is_one_line_and_a_failed_status(corpus, tmp_path):
    folder = tmp_path / "run"
    # the logs, status and token cache fit; a checkpoint (about 1.3 MB) does not
    limit = _limit_file_size(1 << 20)
    result = subprocess.run(train_argv(corpus, folder), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, preexec_fn=limit)  # fmt: skip
    line = last_error_line(result)
    assert line.startswith(f"error: no room to write {folder / 'checkpoints'}")
    assert "MiB needed" in line and "a file-size limit (ulimit -f)" in line
    status = status_of(folder)
    assert status["status"] == "failed" and "no room to write" in status["error"]
    assert not list(folder.rglob("*.tmp"))


@pytest.fixture
def small_disk(tmp_path: Path):  # noqa: ANN201
    """A 3 MiB tmpfs (needs root and mount rights; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_keeps_the_last_good_checkpoint(corpus, tmp_path, small_disk):
    """last.ckpt fits, then best.ckpt beside it: the next save has no room. The run stops in
    one line, status `failed`, and the last good checkpoint loads and resumes elsewhere."""
    folder = small_disk / "run"
    cache = tmp_path / "cache"  # the token cache lives elsewhere, as on a real machine
    env = {**os.environ, "POSLAB_CACHE": str(cache)}
    result = subprocess.run(train_argv(corpus, folder), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
    line = last_error_line(result)
    assert "no room to write" in line and "MiB free on its disk" in line
    assert "is intact; then resume with: python train.py resume=" in line
    assert status_of(folder)["status"] == "failed"
    assert not list(folder.rglob("*.tmp"))
    good = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    assert good["global_step"] > 0


@pytest.mark.slow
def test_a_read_only_place_is_one_line(corpus, tmp_path):
    """A run folder, or a W&B HOME, where nothing can be written: one line, exit code 2."""
    ro = tmp_path / "ro"
    ro.mkdir()
    made = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot make a read-only bind mount here (needs root)")
    try:
        result = subprocess.run(train_argv(corpus, ro / "run"), cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        line = one_error_line(result)
        assert f"cannot write {ro / 'run'}" in line and "Read-only file system" in line
        # a read-only token cache (found while the data is read: the run folder is removed)
        env = {**os.environ, "POSLAB_CACHE": str(ro / "cache")}
        result = subprocess.run(train_argv(corpus, tmp_path / "r2"), cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert f"cannot write {ro / 'cache'}" in one_error_line(result)
        assert not (tmp_path / "r2").exists()
        env = {**os.environ, "HOME": str(ro), "WANDB_MODE": "offline"}
        folder = tmp_path / "wandb_run"
        started = time.time()
        result = subprocess.run(
            train_argv(corpus, folder, "logger=wandb", "trainer.max_steps=10"), cwd=tmp_path,
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]  # it used to fail after the run
        assert "W&B cannot write" in result.stdout + result.stderr
        assert json.loads((folder / "status.json").read_text())["status"] == "completed"
        # eval.py with a read-only out_dir
        result = subprocess.run(
            [sys.executable, str(REPO / "eval.py"), f"run={folder}", f"out_dir={ro / 'eval'}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert f"cannot write {ro / 'eval'}" in one_error_line(result)
        assert time.time() - started < 240
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
