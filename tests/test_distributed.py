"""Scale-out: processes counted in token budgets, trainer=ddp/fsdp configs, one cache build for
racing processes, and a real 2-process DDP run of train.py on CPUs (gloo)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_train, run_in_process
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict, read_write

from poslab.data.cache import TokenCache
from poslab.errors import ConfigError
from poslab.run.training import max_steps_for, run_training, world_size_for

BUDGET = 65536  # tokens; TINY steps train on batch 16 × seq_len 16 = 256 tokens per process
FSDP_ON_CPU = r"^trainer=fsdp needs CUDA GPUs; use trainer=ddp on CPUs$"


# variables through which a cluster or a launcher tells Lightning the processes are already there
CLUSTER_VARS = (
    "SLURM_",
    "LOCAL_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_",
)


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
        [
            f"data.path={corpus}",
            *TINY,
            f"train.max_tokens={BUDGET}",
            "trainer.precision=32-true",
            *overrides,
        ],
        out,
    )


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
    cfg = budget_cfg(
        corpus, tmp_path, ["trainer.devices=[0,1]", "+trainer.accumulate_grad_batches=4"]
    )
    assert max_steps_for(cfg) == BUDGET // (256 * 4 * 2)
    with open_dict(cfg):
        cfg.train.max_tokens = BUDGET + 1  # one token more needs one step more
    assert max_steps_for(cfg) == BUDGET // (256 * 4 * 2) + 1


def test_token_budget_on_cpu_processes(corpus, tmp_path):
    cfg = budget_cfg(
        corpus, tmp_path, ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    )
    assert max_steps_for(cfg) == BUDGET // (256 * 2)
    cfg = budget_cfg(corpus, tmp_path, [])  # trainer=default: one process
    assert max_steps_for(cfg) == BUDGET // 256
    cfg = budget_cfg(corpus, tmp_path, ["trainer.devices=-1"])  # "all GPUs" without GPUs
    with pytest.raises(ConfigError, match="devices"):
        max_steps_for(cfg)


def test_fsdp_config_shards_every_block(four_gpus, corpus, tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy

    from poslab.model.gpt import MLP, Block, GPTConfig

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
    cfg = compose_train(
        [
            f"data.path={corpus}",
            f"data.cache_dir={cache}",
            *TINY,
            "trainer=fsdp",
            "trainer.precision=32-true",
            *extra,
        ],
        tmp_path / "run",
    )
    with pytest.raises(ConfigError, match=FSDP_ON_CPU):
        run_training(cfg)
    assert not cache.exists()


def test_fsdp_on_cpus_cli_says_so_in_one_line(tmp_path, monkeypatch, capfd):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs")
    result = run_in_process(
        "train", ["trainer=fsdp", "model=tiny", "logger=csv"], tmp_path, monkeypatch, capfd
    )
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


def test_cache_builds_without_file_locks(monkeypatch, corpus, tmp_path):
    """Where fcntl is missing (Windows) the cache still builds, just without the lock."""
    import poslab.data.cache

    monkeypatch.setattr(poslab.data.cache, "fcntl", None)
    cache = TokenCache("nolock", path=str(corpus), cache_dir=str(tmp_path))
    assert cache.meta()["splits"]["train"]["tokens"] > 0 and cache.complete
    assert not cache.lock_file.exists()


# ---------------------------------------------------------------------------------------------
# a real DDP run: python train.py trainer=ddp trainer.devices=2 trainer.accelerator=cpu
