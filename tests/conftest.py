"""Shared fixtures: a small corpus the tests make, Hydra-composed configs, tiny trained runs."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from poslab.positions import scheme_names

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "src" / "poslab" / "conf"
SCHEMES = scheme_names()  # every scheme of conf/pos/
WIKITEXT2 = REPO.parent / "shared" / "data" / "wikitext-2"


def make_corpus(folder: Path, n_train: int = 1500, n_valid: int = 150, seed: int = 0) -> Path:
    """WikiText-layout split files of a toy language with learnable structure: sentences from
    a tiny grammar, so a tiny model's loss falls within a few dozen steps."""
    rng = random.Random(seed)
    nouns = [f"n{i}" for i in range(40)]
    verbs = [f"v{i}" for i in range(20)]
    adjs = [f"a{i}" for i in range(15)]

    def line() -> str:
        words = []
        for _ in range(rng.randint(1, 3)):
            noun = rng.choice(nouns)
            # agreement-like dependency: the verb is tied to the noun's index
            verb = verbs[int(noun[1:]) % len(verbs)]
            words += ["the", rng.choice(adjs), noun, verb, "the", rng.choice(nouns), "."]
        return " " + " ".join(words) + " "

    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.txt", n_train), ("valid.txt", n_valid), ("test.txt", n_valid)):
        lines = [" = Title = ", " "] + [line() for _ in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Caches and W&B files go to a temp folder; no test may reach the network."""
    tmp = tmp_path_factory.mktemp("env")
    os.environ["POSLAB_CACHE"] = str(tmp / "cache")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.pop("WANDB_API_KEY", None)
    os.environ["WANDB_MODE"] = "offline"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


TINY = [
    "model=tiny",
    "data.seq_len=16",
    "data.batch_size=16",
    "trainer.max_steps=40",
    "trainer.val_check_interval=20",
    "trainer.enable_progress_bar=false",
    "optim.warmup_steps=5",
    "optim.lr=3e-3",
    "logger=csv",
    "eval.factors=[1,2,4]",
    "eval.modes=[nonoverlapping,sliding]",
    "eval.max_tokens=1500",
]


def compose_train(overrides: list[str], out_dir: Path) -> DictConfig:
    """The config `python train.py OVERRIDES` would get, with Hydra's runtime set up so code
    that asks HydraConfig (run folder, choices) works in-process."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(out_dir)
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    return cfg


def train_in_process(scheme: str, corpus: Path, out_dir: Path, extra: list[str] = ()) -> dict:
    from poslab.training import run_training

    cfg = compose_train([f"pos={scheme}", f"data.path={corpus}", *TINY, *extra], out_dir)
    return run_training(cfg)


@pytest.fixture(scope="session")
def trained_runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """One tiny training run per scheme (real Trainer, checkpoints and eval files on disk):
    scheme -> (run folder, final metrics)."""
    root = tmp_path_factory.mktemp("runs")
    return {s: (root / s, train_in_process(s, corpus, root / s)) for s in SCHEMES}


def contract_problems(result: subprocess.CompletedProcess, expected: str, out: Path) -> list[str]:
    """What breaks the bad-input contract in one command's result: exit code 2, exactly one
    stderr line `error: ...`, no traceback, `expected` in it, and nothing left at `out`."""
    lines = result.stderr.strip().splitlines()
    problems = []
    if result.returncode != 2:
        problems.append(f"exit code {result.returncode}")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"{len(lines)} stderr lines")
    if "Traceback" in result.stderr:
        problems.append("a traceback")
    if expected not in result.stderr:
        problems.append(f"no {expected!r}")
    if out.exists():
        listing = sorted(str(q.relative_to(out)) for q in out.rglob("*")) if out.is_dir() else []
        problems.append(f"left {out.name} {listing}")
    return problems


def race_two_processes(args: list[str], tmp_path: Path) -> list[tuple[str, str]]:
    """Start two processes running `args` + [ready file, go file]; once both have written their
    ready file, create the go file so they start the raced work together. Returns their
    (stdout, stderr) after asserting both exited with 0."""
    procs = [
        subprocess.Popen([*args, str(tmp_path / f"ready{i}"), str(tmp_path / "go")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "the processes did not start"
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    return outputs
