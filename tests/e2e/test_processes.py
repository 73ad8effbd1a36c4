"""System tests that start train.py / eval.py as processes: two runs started together, W&B
without a server, a refused command never writing to the run it names, one training process per
run folder, full disks and read-only places (one line, the last good checkpoint intact).
`slow`; `.ci/run` runs them after the fast suite."""

from __future__ import annotations

import csv
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    REPO,
    SCHEMES,
    TINY,
    WIKITEXT2,
    contents,
    copy_corpus,
    copy_run,
    make_corpus,
    race_two_processes,
    temporaries,
)
from processes import (
    _limit_file_size,
    folder_digest,
    last_error_line,
    one_error_line,
    start_and_wait_for_checkpoint,
    status_of,
    train_argv,
    train_cmd,
    wandb_env,
    wandb_view,
)

from poslab.data.cache import TokenCache
from poslab.data.corpus import file_sha256


def metrics_csv(run: Path) -> list[dict]:
    (path,) = run.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def run_cli(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_two_runs_started_together_get_their_own_folders(corpus, tmp_path):
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        f"data.path={corpus}",
        *TINY,
        "logger=none",
        "trainer.max_steps=2",
        "eval.after_train=false",
        "train.validate_before_fit=false",
    ]
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    runs = sorted((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(runs) == 2, runs
    for run in runs:
        assert json.loads((run / "status.json").read_text())["status"] == "completed"
        assert (run / "checkpoints" / "last.ckpt").is_file()


def test_wandb_that_cannot_reach_its_server_falls_back_to_offline(corpus, tmp_path):
    """Credentials but no server: the run waits logger.init_timeout seconds, not forever, then
    logs offline and finishes."""
    env = {
        **wandb_env(tmp_path),
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": "http://127.0.0.1:9",
    }  # a port where nothing listens
    folder = tmp_path / "run"
    result = subprocess.run(
        train_cmd(corpus, folder, "logger=wandb", "logger.init_timeout=5", "trainer.max_steps=3"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "W&B could not start online" in result.stdout + result.stderr
    assert list((folder / "wandb").glob("offline-run-*"))
    assert json.loads((folder / "status.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_refused_command_never_writes_to_the_run_it_names(corpus, tmp_path):
    run = tmp_path / "run"
    made = subprocess.run(
        train_argv(corpus, run, "trainer.max_steps=20"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
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
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert expected in one_error_line(result)
        assert folder_digest(run) == before, extra  # status, .hydra, log: as they were
    # a finished run resumed: nothing to do, nothing written
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={run}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert folder_digest(run) == before
    # and the run still resumes (its record was not overwritten by the refused commands)
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={run}", "trainer.max_steps=50"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert status_of(run)["status"] == "completed" and status_of(run)["step"] == 50


@pytest.mark.slow
def test_a_second_process_on_a_run_folder_is_refused_with_the_holders_pid(corpus, tmp_path):
    folder = tmp_path / "run"
    # a holder that is still training when the second process looks (60 steps of the tiny
    # model can end before a second Python has imported torch); killed below
    long_run = train_argv(corpus, folder, "trainer.max_steps=100000")
    proc = start_and_wait_for_checkpoint(long_run, folder)
    try:
        before = {k: v for k, v in folder_digest(folder).items() if k.startswith(".hydra")}
        result = subprocess.run(
            [sys.executable, str(REPO / "train.py"), f"resume={folder}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        line = one_error_line(result)
        assert f"in use by another training process (pid {proc.pid})" in line
        assert not (folder / ".hydra-pending").exists()
        assert {k: v for k, v in folder_digest(folder).items() if k.startswith(".hydra")} == before
    finally:
        proc.kill()
        proc.wait()
    # the killed holder's lock went with it: the run resumes, for 5 steps past its checkpoint
    step = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            f"resume={folder}",
            f"trainer.max_steps={step + 5}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.slow
def test_no_room_for_a_checkpoint_is_one_line_and_a_failed_status(corpus, tmp_path):
    folder = tmp_path / "run"
    # the logs, status and token cache fit; a checkpoint (about 1.3 MB) does not
    limit = _limit_file_size(1 << 20)
    result = subprocess.run(
        train_argv(corpus, folder),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
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
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
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
    result = subprocess.run(
        train_argv(corpus, folder),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
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
        result = subprocess.run(
            train_argv(corpus, ro / "run"),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        line = one_error_line(result)
        assert f"cannot write {ro / 'run'}" in line and "Read-only file system" in line
        # a read-only token cache (found while the data is read: the run folder is removed)
        env = {**os.environ, "POSLAB_CACHE": str(ro / "cache")}
        result = subprocess.run(
            train_argv(corpus, tmp_path / "r2"),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"cannot write {ro / 'cache'}" in one_error_line(result)
        assert not (tmp_path / "r2").exists()
        env = {**os.environ, "HOME": str(ro), "WANDB_MODE": "offline"}
        folder = tmp_path / "wandb_run"
        started = time.time()
        result = subprocess.run(
            train_argv(corpus, folder, "logger=wandb", "trainer.max_steps=10"),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert result.returncode == 0, result.stderr[-3000:]  # it used to fail after the run
        assert "W&B cannot write" in result.stdout + result.stderr
        assert json.loads((folder / "status.json").read_text())["status"] == "completed"
        # eval.py with a read-only out_dir
        result = subprocess.run(
            [sys.executable, str(REPO / "eval.py"), f"run={folder}", f"out_dir={ro / 'eval'}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"cannot write {ro / 'eval'}" in one_error_line(result)
        assert time.time() - started < 240
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


def eval_py(args: list[str], cwd: Path, file_size_limit: int | None = None):
    """Run eval.py; with `file_size_limit` no file can grow past that many bytes (RLIMIT_FSIZE:
    a write beyond it fails with EFBIG, as on a full disk; Python ignores SIGXFSZ)."""

    def limit() -> None:
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, str(REPO / "eval.py"), *args, "wandb=false"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error")]


def test_eval_py_on_a_full_disk_keeps_the_previous_results(trained_runs, tmp_path):
    """The defect: a full disk turned a valid extrapolation.json into a truncated one while the
    csv/md stayed old. Now: one error line, exit 2, the old set byte for byte, no temporary."""
    run = copy_run(trained_runs["rope"][0], tmp_path / "run")
    # an eval.py out_dir that holds a set of results (a training run's own folder is refused as
    # out_dir: its results are never replaced)
    out = tmp_path / "eval"
    args = [f"run={run}", f"out_dir={out}", "eval.factors=[1,2,4]", "eval.max_tokens=1500"]
    first = eval_py(args, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = contents(out / "extrapolation")
    # the checkpoint is only read; eval.log (~1 kB) fits, the new JSON (~7 kB) does not
    result = eval_py(args, tmp_path, file_size_limit=4096)
    errors = error_lines(result.stderr)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors[0].startswith(f"error: cannot write {out / 'extrapolation/extrapolation.json'}")
    assert "the disk is full" in errors[0] and "previous results are intact" in errors[0]
    assert contents(out / "extrapolation") == before
    assert temporaries(out) == []


def test_train_py_multirun_each_job_its_own_offline_wandb_run(corpus, tmp_path):
    """`python train.py -m pos=rope,alibi`: two jobs, two W&B offline runs (chosen because no
    credentials exist), and the sweep's comparison table."""
    env = {"HOME": str(tmp_path), "NETRC": str(tmp_path / "none")}
    env_clean = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE",)}
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "-m",
            "pos=rope,alibi",
            f"data.path={corpus}",
            *[o for o in TINY if not o.startswith("logger=")],
            "logger=wandb",
            "trainer.max_steps=10",
            "eval.factors=[1,2]",
            "eval.modes=[nonoverlapping]",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env_clean, **env},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(sweep.glob("*/wandb/offline-run-*"))
    # job folders and W&B runs are named by data, scheme, model, L, steps and seed
    jobs = ["0_wikitext2-rope-tiny-L16-10steps-s1234", "1_wikitext2-alibi-tiny-L16-10steps-s1234"]
    assert [r.parts[-3] for r in runs] == jobs
    assert len({r.name.rsplit("-", 1)[1] for r in runs}) == 2  # distinct run ids
    assert all((sweep / j / "checkpoints" / "best.ckpt").is_file() for j in jobs)
    table = (sweep / "comparison" / "comparison.md").read_text()
    assert "| rope |" in table and "| alibi |" in table
    # the jobs share the sweep's W&B group, and the merged comparison is one more run of it
    groups = {wandb_view(sweep / job / "wandb")[1]["run_group"] for job in jobs}
    assert groups == {"sweep"}
    summary, run = wandb_view(sweep / "wandb")
    assert run["job_type"] == "comparison" and run["run_group"] == "sweep"
    assert summary["summary"]["comparison/table"]["nrows"] > 0
    assert "anonymous setting" not in result.stderr


# what both raced scripts do first: wait for the go file, then ask for the cache together
RACE_START = r"""from pathlib import Path
from poslab.data.cache import TokenCache
logging.basicConfig(level=logging.INFO, format="%(process)d %(message)s")
corpus, cache_dir, ready, go = sys.argv[1:5]
Path(ready).touch()
while not Path(go).exists():  # both processes ask for the cache at the same moment
    time.sleep(0.001)
cache = TokenCache("race", path=corpus, cache_dir=cache_dir)
"""


def test_two_processes_on_a_stale_cache_rebuild_it_once(corpus, tmp_path):
    """Both see a cache built from other contents; one rebuilds it, the other waits and reads."""
    data = copy_corpus(corpus, tmp_path / "data")
    cache_dir = tmp_path / "cache"
    TokenCache("race", path=str(data), cache_dir=str(cache_dir)).meta()
    valid = data / "valid.txt"
    stat = valid.stat()
    valid.write_text(valid.read_text().replace(" the ", " a10 ", 1))  # same size, other text
    os.utime(valid, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    args = [sys.executable, "-c", STALE_RACE, str(data), str(cache_dir)]
    outputs = race_two_processes(args, tmp_path)
    # both read the same cache, rebuilt from the file as it is now
    assert outputs[0][0] == outputs[1][0] and outputs[0][0].split()[0] == file_sha256(valid)
    logs = "".join(err for _, err in outputs)
    assert logs.count("rebuilding the token cache") == 1 and logs.count("tokenizing") == 1, logs


RACE = (
    "import hashlib, json, logging, sys, time\n"
    + RACE_START
    + r"""digest = hashlib.sha256(json.dumps(cache.meta(), sort_keys=True).encode())
for split in ("train", "validation", "test"):
    for array in vars(cache.split(split)).values():
        digest.update(array.tobytes())
print(digest.hexdigest())
"""
)


def test_two_processes_on_a_fresh_cache_build_it_once(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", n_train=3000)
    cache_dir = tmp_path / "cache"
    args = [sys.executable, "-c", RACE, str(corpus), str(cache_dir)]
    outputs = race_two_processes(args, tmp_path)
    digests = [out.strip() for out, _ in outputs]
    assert len(digests[0]) == 64 and digests[0] == digests[1]
    logs = "".join(err for _, err in outputs)
    assert logs.count("tokenizing") == 1, logs  # the other process waited, then read
    again = TokenCache("race", path=str(corpus), cache_dir=str(cache_dir))
    assert again.complete and again.lock_file.parent == cache_dir


def run_ranks(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run train.py in its own process group, so a timeout also ends the ranks it started."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"train.py with 2 DDP ranks timed out:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ddp_on_two_cpu_processes_splits_the_data_and_agrees_on_the_weights(corpus, tmp_path):
    run = tmp_path / "run"
    env = {"POSLAB_CACHE": str(tmp_path / "cache")}  # a fresh cache
    if sys.platform == "linux":
        env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    result = run_ranks(
        [
            str(REPO / "train.py"),
            "pos=alibi",
            f"data.path={corpus}",
            *TINY,
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "train.max_tokens=4096",
            "eval.factors=[1,2]",
            "eval.modes=[nonoverlapping]",
            "eval.max_tokens=500",
            "++train.fingerprints=true",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((run / "fingerprints" / f"rank{k}.json").read_text()) for k in (0, 1)]

    # the budget counts both processes: 4096 tokens = 8 steps × 2 ranks × 16 × 16 tokens
    for k, rank in enumerate(ranks):
        assert (rank["global_rank"], rank["world_size"]) == (k, 2)
        assert rank["global_step"] == rank["batches"] == 8 and rank["tokens"] == 2048
    # each rank read its own batches (DistributedSampler) ...
    assert ranks[0]["batches_digest"] != ranks[1]["batches_digest"]
    assert not set(ranks[0]["batch_digests"]) & set(ranks[1]["batch_digests"])
    # ... and they started from, and ended with, bitwise identical weights
    assert ranks[0]["params_start"] == ranks[1]["params_start"]
    assert ranks[0]["params_end"] == ranks[1]["params_end"] != ranks[0]["params_start"]

    # one run folder for both ranks: rank 1 logs beside rank 0, nothing lands elsewhere
    assert (run / "train.log").is_file() and (run / "train_ddp_process_1.log").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "run"]
    assert (run / "checkpoints" / "best.ckpt").is_file()
    # the corpus was tokenized once; only rank 0 ran the after-training evaluation
    assert (result.stdout + result.stderr).count("tokenizing") == 1
    assert (run / "extrapolation" / "extrapolation.json").is_file()
    assert "[poslab.evaluation" in (run / "train.log").read_text()  # its loggers' lines
    assert "[poslab.evaluation" not in (run / "train_ddp_process_1.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/wikitext-2 not present")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_acceptance_command_on_wikitext2(scheme, tmp_path):
    """Issue #2's acceptance run on the real corpus (about a minute per scheme on 2 cores)."""
    result = run_cli(
        [
            str(REPO / "train.py"),
            f"pos={scheme}",
            f"data.path={WIKITEXT2}",
            "model=tiny",
            "data.seq_len=64",
            "trainer.max_steps=60",
            "logger=csv",
            "eval.after_train=false",
            f"hydra.run.dir={tmp_path}",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file()
    val = [float(r["val/loss"]) for r in metrics_csv(tmp_path) if r.get("val/loss")]
    assert val[-1] < val[0]


STALE_RACE = (
    "import hashlib, logging, sys, time\n"
    + RACE_START
    + r"""ids = cache.split("validation").ids
print(cache.meta()["inputs"]["files"]["validation"]["sha256"], hashlib.sha256(ids).hexdigest())
"""
)


def test_hub_unreachable_says_pass_data_path(tmp_path):
    # HF_HUB_OFFLINE=1 (set for the session) makes the hub fail at once instead of timing out
    code = (
        "from poslab.data.corpus import read_corpus\n"
        f"read_corpus('Salesforce/wikitext', 'wikitext-2-v1', None, r'{tmp_path}')\n"
    )
    result = run_cli(["-c", code], tmp_path, {"HF_HOME": str(tmp_path / "hf")})
    assert result.returncode != 0
    assert "pass data.path=DIR" in result.stderr
