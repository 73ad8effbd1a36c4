"""Shared fixtures: a small corpus the tests make, Hydra-composed configs, tiny trained runs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import resource
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

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


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n 2`) each worker computes on one thread: two workers on two cores
    without oversubscription (the tests are small ops, where a second thread buys little)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


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


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> dict[str, Path]:
    """Tiny random HF causal LMs saved with their tokenizer (tests/hf_models.py)."""
    from hf_models import make_hf_models

    return make_hf_models(tmp_path_factory.mktemp("hf"), corpus)


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
    from poslab.run.training import run_training

    cfg = compose_train([f"pos={scheme}", f"data.path={corpus}", *TINY, *extra], out_dir)
    return run_training(cfg)


def eval_cfg(**overrides) -> DictConfig:
    """conf/eval/default.yaml for the tiny runs (1500 tokens, no W&B), with `overrides`."""
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.max_tokens, cfg.log_wandb = 1500, False
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def child_checkpoint(corpus: Path, parent: Path, overrides: list[str], out: Path) -> Path:
    """A child of extend=`parent` at 0 steps, as training builds it (inherit_parent with the
    command line `overrides`, LanguageModel, the parent's weights), saved by a Lightning
    Trainer as a checkpoint (tests/run/test_extend.py, test_drope.py)."""
    import lightning as L
    from omegaconf import OmegaConf

    from poslab.run.extend import inherit_parent, load_parent_weights
    from poslab.run.lit import LanguageModel

    args = ["pos=rope", f"data.path={corpus}", *TINY, f"extend={parent}", *overrides]
    cfg = compose_train(args, out)
    found = inherit_parent(cfg, asked=args)
    module = LanguageModel(OmegaConf.to_container(cfg, resolve=True), found.vocab_size)
    load_parent_weights(module.model, found)
    module.tokenizer_record = found.ckpt.get("tokenizer")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(out / "child.ckpt", weights_only=True)
    return out / "child.ckpt"


def score_checkpoint(ckpt: Path | str, cfg: DictConfig) -> list[dict]:
    """The rows `evaluate_checkpoint` returns for a text checkpoint (its planning and scoring),
    without writing the reports: for tests of the numbers (the reports have tests of their
    own, and drawing two figures costs more than scoring a tiny model)."""
    from poslab.evaluation.run import evaluate_text, plan_checkpoint

    rows, _ = evaluate_text(plan_checkpoint(ckpt, cfg), None, None)
    return rows


class TrainedRuns(Mapping):
    """scheme -> (run folder, final metrics) of one tiny training run per scheme (real Trainer,
    checkpoints and eval files on disk), each trained the first time it is asked for: a test
    that needs two schemes' runs does not wait for every scheme's.

    The runs are shared by the pytest-xdist workers: a scheme is trained once per test session,
    by the first worker that asks (a file lock per scheme), and read from disk by the others."""

    def __init__(self, corpus: Path, root: Path) -> None:
        self.corpus, self.root, self.metrics = corpus, root, {}
        self.locks = root.parent / f"{root.name}.locks"  # beside the runs: not a run folder
        self.locks.mkdir(parents=True, exist_ok=True)

    def _metrics_file(self, scheme: str) -> Path:
        return self.locks / f"{scheme}.json"

    def _train(self, scheme: str, timeout: float) -> bool:
        """Train `scheme` unless it is trained; False when another worker holds it (timeout)."""
        from filelock import FileLock, Timeout

        try:
            with FileLock(str(self.locks / f"{scheme}.lock"), timeout=timeout):
                if not self._metrics_file(scheme).exists():
                    # a folder without its metrics is a worker's crashed attempt: start afresh
                    # (a run folder left there would be resumed)
                    shutil.rmtree(self.root / scheme, ignore_errors=True)
                    metrics = train_in_process(scheme, self.corpus, self.root / scheme)
                    # renamed into place: a worker that checks for the file outside the lock
                    # never reads it half written
                    partial = self.locks / f"{scheme}.json.partial"
                    partial.write_text(json.dumps(metrics))
                    partial.replace(self._metrics_file(scheme))
        except Timeout:
            return False
        return True

    def __getitem__(self, scheme: str) -> tuple[Path, dict]:
        if scheme not in SCHEMES:
            raise KeyError(scheme)
        if scheme not in self.metrics:
            if not self._metrics_file(scheme).exists():
                self._train(scheme, timeout=-1)  # -1: wait for a worker training it
            self.metrics[scheme] = json.loads(self._metrics_file(scheme).read_text())
        return self.root / scheme, self.metrics[scheme]

    def train_all(self) -> None:
        """Every scheme trained: first those no other worker is training, then wait for the
        rest, so two workers asking for all of them split the work instead of queueing."""
        waiting = [s for s in SCHEMES if not self._train(s, timeout=0)]
        for scheme in waiting:
            self._train(scheme, timeout=-1)

    def values(self):  # noqa: ANN201 (Mapping's view)
        self.train_all()
        return super().values()

    def items(self):  # noqa: ANN201 (Mapping's view)
        self.train_all()
        return super().items()

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEMES)

    def __len__(self) -> int:
        return len(SCHEMES)


@pytest.fixture(scope="session")
def trained_runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """One tiny training run per scheme: scheme -> (run folder, final metrics), shared by the
    xdist workers of this session (their base folders' common parent)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return TrainedRuns(corpus, shared / "trained_runs")


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
        subprocess.Popen(
            [*args, str(tmp_path / f"ready{i}"), str(tmp_path / "go")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
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


# ---------------------------------------------------------------------------------------------
# the commands, in-process: train.py and eval.py through the entry() they call, the scripts
# through their main()


def run_in_process(
    app: str,
    args: list[str],
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
) -> subprocess.CompletedProcess:
    """`python train.py ARGS` (app "train"), `python eval.py ARGS` ("eval") or `python
    scripts/APP ARGS` ("benchmark.py", "compare.py", "analysis.py") run in this process, from
    `cwd`, through the function the command calls: its exit code (SystemExit; an uncaught
    exception is 1 with its traceback on stderr, as a process would show it), stdout and
    stderr. Hydra's global state, the root logger's handlers and sys.argv are put back after."""
    if app in ("train", "eval"):
        from poslab.apps import evaluate, train

        script, call = str(REPO / f"{app}.py"), {"train": train.entry, "eval": evaluate.entry}[app]
    else:
        script = str(REPO / "scripts" / app)
        monkeypatch.syspath_prepend(str(REPO / "scripts"))  # as `python scripts/APP` has it
        call = _script_main(app)
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # run_app sets it to 1; monkeypatch puts it back
    monkeypatch.chdir(cwd)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    capfd.readouterr()
    code = 0
    try:
        call()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception:
        traceback.print_exc()
        code = 1
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        GlobalHydra.instance().clear()
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([script, *args], code, out, err)


def _script_main(app: str):  # noqa: ANN202
    """The main() scripts/APP calls (pretrained_parity.py's lives in the script)."""
    if app == "compare.py":
        from poslab.report.compare import main

        return main
    if app == "analysis.py":
        from poslab.analysis import main

        return main
    if app == "benchmark.py":
        from poslab.bench.cli import main

        return main
    if app == "benchmark_generation.py":
        from poslab.bench.generation import main

        return main
    if app == "export_hf.py":
        from poslab.hf.export import main

        return main
    if app == "budget.py":
        from poslab.report.budget import main

        return main
    if app == "vocabulary_change.py":
        from poslab.report.vocabulary_change import main

        return main
    if app == "collect_study.py":
        from poslab.study.collect import main

        return main
    assert app == "pretrained_parity.py", app
    import importlib.util

    name = f"poslab_{app.removesuffix('.py')}_script"
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / app)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module.main


# ---------------------------------------------------------------------------------------------
# inputs of the bad-input tables (tests/bad_inputs.py), made once per session

# a validation split of 8 tokens (7 words of the corpus' vocabulary and <eos>)
SHORT_VALID = " the a1 n1 v1 the n2 . \n"


@pytest.fixture(scope="session")
def bad_corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Corpora with one bad split each: binary, not UTF-8, only blank lines, shorter than a
    window, a folder, a broken symlink, an empty train split; a random file as a checkpoint."""
    root = tmp_path_factory.mktemp("bad_corpora")
    binary = make_corpus(root / "binary", n_train=50, n_valid=10)
    (binary / "train.txt").write_bytes(bytes(range(256)) * 40)
    latin1 = make_corpus(root / "latin1", n_train=50, n_valid=10)
    (latin1 / "valid.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    blank = make_corpus(root / "blank", n_train=50, n_valid=10)
    (blank / "valid.txt").write_text("\n \n\t\n")
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
    return {
        "binary": binary,
        "latin1": latin1,
        "blank": blank,
        "short": short,
        "vdir": vdir,
        "vlink": vlink,
        "tdir": tdir,
        "tempty": tempty,
        "missing": root / "missing.txt",
        "random": random_ckpt,
    }


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def task_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny passkey run (2 steps; no evaluation after training)."""
    from poslab.run.training import run_training

    out = tmp_path_factory.mktemp("task") / "passkey"
    run_training(
        compose_train(
            [
                "data=passkey",
                "pos=rope",
                "model=tiny",
                "data.seq_len=32",
                "data.batch_size=8",
                "trainer.max_steps=2",
                "trainer.val_check_interval=2",
                "trainer.enable_progress_bar=false",
                "optim.warmup_steps=1",
                "data.val_examples=8",
                "logger=none",
                "eval.after_train=false",
            ],
            out,
        )
    )
    return out


def case_values(request: pytest.FixtureRequest, templates: tuple[str, ...]) -> dict[str, str]:
    """The {names} of the train.py / eval.py table templates (tests/bad_inputs.py), from the
    fixtures that make them; only those a case names are made."""
    import string

    names = {f for t in templates for _, f, _, _ in string.Formatter().parse(t) if f}
    names.add("corpus")  # every training case reads it
    values = {}
    for name in names - {"out"}:
        if name == "corpus":
            values[name] = str(request.getfixturevalue("corpus"))
        elif name == "file":
            values[name] = str(request.getfixturevalue("corpus") / "train.txt")
        elif name == "task":
            values[name] = str(request.getfixturevalue("task_run"))
        elif name in ("learned", "rope"):
            values[name] = str(request.getfixturevalue("trained_runs")[name][0])
        elif name.startswith("hf_"):  # a tiny saved HF model: {hf_llama}, {hf_bert}, ...
            values[name] = str(request.getfixturevalue("hf_models")[name.removeprefix("hf_")])
        elif name in ("mrope", "cut"):
            values[name] = str(request.getfixturevalue("mrope_runs")[name])
        else:
            values[name] = str(request.getfixturevalue("bad_corpora")[name])
    return values


def result_rows() -> list[dict]:
    """Three rows of one run as eval.py writes them (the fields compare.py reads)."""
    return [
        {
            "scheme": "rope",
            "train_length": 16,
            "mode": "nonoverlapping",
            "split": "validation",
            "length": n,
            "factor": n / 16,
            "status": "ok",
            "loss": 3.0,
            "ppl": 20.0,
        }
        for n in (16, 32, 64)
    ]


def write_results(folder: Path, rows: list[dict]) -> Path:
    path = folder / "extrapolation" / "extrapolation.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rows))
    return folder


@pytest.fixture(scope="session")
def script_inputs(tmp_path_factory: pytest.TempPathFactory, task_run: Path) -> dict[str, Path]:
    """Inputs a new user might pass the scripts by mistake: hand-edited results, a regular file,
    an empty folder, a checkpoint of a generated task, one whose corpus was deleted."""
    root = tmp_path_factory.mktemp("inputs")
    good = result_rows()
    abc, negative, missing = result_rows(), result_rows(), result_rows()
    abc[1]["length"], negative[1]["length"] = "abc", -5
    del missing[2]["length"]
    gone = make_corpus(root / "gone_corpus", n_train=200, n_valid=40)
    train_in_process(
        "rope",
        gone,
        root / "corpus_gone",
        ["trainer.max_steps=2", "eval.after_train=false", "logger=none"],
    )
    shutil.rmtree(gone)
    (root / "empty_folder").mkdir()
    (root / "file").write_text("not a checkpoint, not results\n")
    return {
        "good": write_results(root / "good", good),
        "length_abc": write_results(root / "length_abc", abc),
        "length_negative": write_results(root / "length_negative", negative),
        "length_missing": write_results(root / "length_missing", missing),
        "results": root / "good",
        "task": task_run,
        "corpus_gone": root / "corpus_gone",
        "gone": gone,
        "empty_folder": root / "empty_folder",
        "file": root / "file",
    }


@contextlib.contextmanager
def file_size_limit(n: int) -> Iterator[None]:
    """In this process, no file grows past `n` bytes while the block runs (RLIMIT_FSIZE's soft
    limit, restored after): a real EFBIG, as a full disk gives ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def contents(folder: Path) -> dict[str, bytes]:
    """file name -> bytes of every file in `folder` (a run's files, compared before and after)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.tmp"))


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def copy_corpus(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
