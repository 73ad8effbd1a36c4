"""Scale-out: processes counted in token budgets, trainer=ddp/fsdp configs, one cache build for
racing processes, and a real 2-process DDP run of train.py on CPUs (gloo)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY, compose_train, make_corpus, race_two_processes
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict, read_write

from poslab.data import TokenCache
from poslab.errors import ConfigError
from poslab.training import max_steps_for, run_training, world_size_for

BUDGET = 65536  # tokens; TINY steps train on batch 16 × seq_len 16 = 256 tokens per process
FSDP_ON_CPU = r"^trainer=fsdp needs CUDA GPUs; use trainer=ddp on CPUs$"


# variables through which a cluster or a launcher tells Lightning the processes are already there
CLUSTER_VARS = ("SLURM_", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "TORCHELASTIC_")  # fmt: skip


@pytest.fixture(autouse=True)
def _not_in_a_cluster_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that run inside a SLURM allocation (or under torchrun) see a plain machine, so
    Lightning counts and starts processes itself."""
    for name in list(os.environ):
        if name.startswith(CLUSTER_VARS):
            monkeypatch.delenv(name)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's device parsing sees 4 CUDA GPUs (nothing runs on them: no Trainer fits)."""
    import lightning.fabric.accelerators.cuda as fabric_cuda
    import lightning.pytorch.accelerators.cuda as pytorch_cuda

    for module in (fabric_cuda, pytorch_cuda):
        monkeypatch.setattr(module, "num_cuda_devices", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def budget_cfg(corpus: Path, out: Path, overrides: list[str]):
    # an explicit precision: the default asks the (mocked) CUDA runtime for bf16 support
    return compose_train(
        [f"data.path={corpus}", *TINY, f"train.max_tokens={BUDGET}", "trainer.precision=32-true",
         *overrides],
        out,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "processes"),
    [
        (["trainer.devices=-1"], 4),  # all GPUs
        (["trainer.devices=auto"], 4),
        (["trainer.devices=[0,2]"], 2),  # GPU ids
        (["trainer.devices='2'"], 2),  # a count as a string
        (["trainer.devices='0,1,3'"], 3),  # ids as a string
        (["trainer=ddp"], 4),  # devices: auto
        (["trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"], 8),
        (["+trainer.num_nodes=2"], 2),  # one device on each of two nodes
        (["trainer.accelerator=cpu", "trainer.devices=3"], 3),  # CPU processes beside GPUs
        (["trainer=fsdp", "trainer.devices=2"], 2),
    ],
)
def test_token_budget_counts_every_process(four_gpus, corpus, tmp_path, overrides, processes):
    cfg = budget_cfg(corpus, tmp_path, overrides)
    assert world_size_for(OmegaConf.to_container(cfg.trainer, resolve=True)) == processes
    assert max_steps_for(cfg) == math.ceil(BUDGET / (256 * processes))


def test_token_budget_counts_gradient_accumulation_and_rounds_up(four_gpus, corpus, tmp_path):
    cfg = budget_cfg(corpus, tmp_path, ["trainer.devices=[0,1]",
                                        "+trainer.accumulate_grad_batches=4"])  # fmt: skip
    assert max_steps_for(cfg) == BUDGET // (256 * 4 * 2)
    with open_dict(cfg):
        cfg.train.max_tokens = BUDGET + 1  # one token more needs one step more
    assert max_steps_for(cfg) == BUDGET // (256 * 4 * 2) + 1


def test_token_budget_on_cpu_processes(corpus, tmp_path):
    cfg = budget_cfg(corpus, tmp_path, ["trainer=ddp", "trainer.accelerator=cpu",
                                        "trainer.devices=2"])  # fmt: skip
    assert max_steps_for(cfg) == BUDGET // (256 * 2)
    cfg = budget_cfg(corpus, tmp_path, [])  # trainer=default: one process
    assert max_steps_for(cfg) == BUDGET // 256
    cfg = budget_cfg(corpus, tmp_path, ["trainer.devices=-1"])  # "all GPUs" without GPUs
    with pytest.raises(ConfigError, match="devices"):
        max_steps_for(cfg)


def test_fsdp_config_shards_every_block(four_gpus, corpus, tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy

    from poslab.model import MLP, Block, GPTConfig

    cfg = budget_cfg(corpus, tmp_path, ["trainer=fsdp"])
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    policy = strategy.kwargs["auto_wrap_policy"]  # ModuleWrapPolicy
    config = GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16)
    assert policy(module=Block(config), recurse=False, nonwrapped_numel=0)
    assert not policy(module=MLP(config), recurse=False, nonwrapped_numel=0)


@pytest.mark.parametrize("gpus", [0, 4])
def test_fsdp_on_cpus_is_one_clear_error_before_any_work(monkeypatch, corpus, tmp_path, gpus):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    # with GPUs present, asking for CPUs: the error must come before any data is read (a fresh
    # token cache folder stays absent)
    extra = ["trainer.accelerator=cpu"] if gpus else []
    cache = tmp_path / "cache"
    cfg = compose_train([f"data.path={corpus}", f"data.cache_dir={cache}", *TINY, "trainer=fsdp",
                         "trainer.precision=32-true", *extra], tmp_path / "run")  # fmt: skip
    with pytest.raises(ConfigError, match=FSDP_ON_CPU):
        run_training(cfg)
    assert not cache.exists()


def test_fsdp_on_cpus_cli_says_so_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs")
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "trainer=fsdp", "model=tiny", "logger=csv"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: trainer=fsdp needs CUDA GPUs; use trainer=ddp on CPUs"
    )
    assert "Traceback" not in result.stderr


def test_local_sweep_with_ddp_subprocesses_is_refused(corpus, tmp_path):
    """Lightning's default DDP launcher re-runs the command line for each rank: in a -m sweep
    that would re-run the sweep. start_method=spawn starts the ranks from the job instead."""
    overrides = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    cfg = budget_cfg(corpus, tmp_path, overrides)
    hydra = HydraConfig.instance()
    try:
        with read_write(cfg.hydra):
            cfg.hydra.mode = RunMode.MULTIRUN
        hydra.set_config(cfg)
        with pytest.raises(ConfigError, match="trainer.strategy.start_method=spawn"):
            max_steps_for(cfg)
        cfg = budget_cfg(corpus, tmp_path, [*overrides, "trainer.strategy.start_method=spawn"])
        with read_write(cfg.hydra):
            cfg.hydra.mode = RunMode.MULTIRUN
        hydra.set_config(cfg)
        assert max_steps_for(cfg) == BUDGET // (256 * 2)
    finally:
        compose_train([f"data.path={corpus}", *TINY], tmp_path)  # back to a single run


# ---------------------------------------------------------------------------------------------
# the token cache: one build, whoever comes first

RACE = r"""
import hashlib, json, logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(process)d %(message)s")
from poslab.data import TokenCache
corpus, cache_dir, ready, go = sys.argv[1:5]
Path(ready).touch()
while not Path(go).exists():  # both processes ask for the cache at the same moment
    time.sleep(0.001)
cache = TokenCache("race", path=corpus, cache_dir=cache_dir)
digest = hashlib.sha256(json.dumps(cache.meta(), sort_keys=True).encode())
for split in ("train", "validation", "test"):
    for array in vars(cache.split(split)).values():
        digest.update(array.tobytes())
print(digest.hexdigest())
"""


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


def test_cache_builds_without_file_locks(monkeypatch, corpus, tmp_path):
    """Where fcntl is missing (Windows) the cache still builds, just without the lock."""
    import poslab.data

    monkeypatch.setattr(poslab.data, "fcntl", None)
    cache = TokenCache("nolock", path=str(corpus), cache_dir=str(tmp_path))
    assert cache.meta()["splits"]["train"]["tokens"] > 0 and cache.complete
    assert not cache.lock_file.exists()


# ---------------------------------------------------------------------------------------------
# a real DDP run: python train.py trainer=ddp trainer.devices=2 trainer.accelerator=cpu


def run_ranks(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run train.py in its own process group, so a timeout also ends the ranks it started."""
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
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
        [str(REPO / "train.py"), "pos=alibi", f"data.path={corpus}", *TINY, "trainer=ddp",
         "trainer.accelerator=cpu", "trainer.devices=2", "train.max_tokens=4096",
         "eval.factors=[1,2]", "eval.modes=[nonoverlapping]", "eval.max_tokens=500",
         "++train.fingerprints=true", f"hydra.run.dir={run}"],
        tmp_path, env,
    )  # fmt: skip
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
