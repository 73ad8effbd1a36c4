"""`pip install poslab` works outside a checkout: the wheel carries every config (conf/**/*.yaml,
the schemes' shared options included), and the installed commands compose them from an empty
folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from poslab.positions import scheme_configs, scheme_names

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "src" / "poslab" / "conf"


def python(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300):
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (the checkout gets no build/ folder), installed
    into a folder of its own: the site folder to put on PYTHONPATH."""
    pytest.importorskip("setuptools")  # the build backend, used offline (--no-build-isolation)
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", source / "src", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    wheels = root / "wheels"
    build = ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    python([*build, str(source)], root)
    (wheel,) = wheels.glob("poslab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"poslab/conf/{p.relative_to(CONF).as_posix()}" for p in CONF.rglob("*.yaml")}
    assert configs - names == set()
    # the model files an HF export copies into its folder (poslab/hf/remote/, no package)
    remote = REPO / "src" / "poslab" / "hf" / "remote"
    assert {f"poslab/hf/remote/{p.name}" for p in remote.glob("*.py")} - names == set()
    # Hydra's search path plugin for a researcher's own configs (POSLAB_USER)
    assert "hydra_plugins/poslab_user/search_path.py" in names
    site = root / "site"
    python(["-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], root)
    return site


@pytest.fixture
def outside(installed: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An empty folder and an environment in which `import poslab` is the installed copy."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(installed), "WANDB_MODE": "offline"}
    return empty, env


def test_train_composes_its_config_from_the_installed_package(outside):
    empty, env = outside
    result = python(["-m", "poslab.apps.train", "--cfg", "job", "pos=rope"], empty, env)
    assert "_target_: poslab.positions.rope.Rotary" in result.stdout
    assert "randomize_max: null" in result.stdout  # the options rope shares with other schemes
    assert list(empty.iterdir()) == []


def test_the_console_script_runs(installed, outside):
    empty, env = outside
    script = installed / "bin" / "poslab-train"
    if not script.is_file():
        pytest.skip("pip installed no console scripts into the target folder")
    result = python([str(script), "--cfg", "job", "pos=alibi"], empty, env)
    assert "_target_: poslab.positions.alibi.ALiBi" in result.stdout


def test_an_installed_poslab_exports_any_scheme_with_its_model_code(outside, tmp_path):
    """The export's custom-code path reads its modules from the installed package."""
    empty, env = outside
    script = (
        "import sys; from pathlib import Path\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from exported_models import run_config, trained_looking, word_tokenizer\n"
        "from poslab.hf.export import export_custom_code\n"
        "config = run_config('alibi', 'auto', {})\n"
        "export_custom_code(trained_looking(config), config, word_tokenizer(), Path(sys.argv[2]))\n"
    )
    out = tmp_path / "exported"
    python(["-c", script, str(REPO / "tests"), str(out)], empty, env)
    assert (out / "modeling_poslab.py").is_file() and (out / "poslab_positions_alibi.py").is_file()


def test_the_installed_scheme_list_is_the_checkouts(installed, outside):
    empty, env = outside
    script = (
        "import json, poslab\n"
        "from poslab.positions import scheme_configs, scheme_names\n"
        "print(json.dumps([poslab.__file__, scheme_names(), scheme_configs(48)]))\n"
    )
    where, names, configs = json.loads(python(["-c", script], empty, env).stdout)
    assert Path(where).is_relative_to(installed)
    assert names == scheme_names()
    assert configs == scheme_configs(48)


COMMANDS = (
    "poslab-eval",
    "poslab-compare",
    "poslab-replot",
    "poslab-runs",
    "poslab-bench",
    "poslab-bench-generation",
    "poslab-analysis",
    "poslab-baselines",
    "poslab-longrope-search",
    "poslab-export",
    "poslab-generate",
    "poslab-study",
    "poslab-same-numbers",
    "poslab-check-scheme",
)


def test_every_command_is_an_installed_console_script(installed, outside):
    """pyproject.toml's [project.scripts] is the one list of commands (issue #44): each installed
    script starts and answers --help outside the checkout."""
    empty, env = outside
    if not (installed / "bin" / "poslab-train").is_file():
        pytest.skip("pip installed no console scripts into the target folder")
    for name in COMMANDS:
        # exit code 0 (python() checks it) and a help text: argparse's usage, or Hydra's
        result = python([str(installed / "bin" / name), "--help"], empty, env)
        assert "usage" in result.stdout.lower() or "powered by Hydra" in result.stdout, name
    # the benchmark's memory server runs as a module of the installed package
    result = python(["-m", "poslab.bench", "--help"], empty, env)
    assert "--memory-server" not in result.stderr


TINY_STUDY = """\
# a researcher's study: their scheme beside alibi, two seeds each
experiment: quickstart
grid:
  pos: [logdist, alibi]
  seed: [1, 2]
baseline: alibi
"""


def test_a_researchers_own_scheme_runs_through_every_tool(outside, corpus, tmp_path):
    """examples/own-scheme/ as a user's folder (POSLAB_USER), with poslab installed from its
    wheel: the property checks pass, a study of the scheme beside alibi trains and evaluates
    every job (a -m sweep each) and merges them, the row gets the "other" family, and the
    export refuses the scheme in one line."""
    from conftest import TINY

    empty, env = outside
    mine = tmp_path / "mine"
    shutil.copytree(REPO / "examples" / "own-scheme", mine)
    env = {**env, "POSLAB_USER": str(mine), "OMP_NUM_THREADS": "1"}
    checked = python(["-m", "poslab.apps.check_scheme", "pos=logdist"], empty, env)
    assert "pos=logdist: all passed" in checked.stdout

    (mine / "study.yaml").write_text(TINY_STUDY)
    out = tmp_path / "study"
    tiny = [o for o in TINY if not o.startswith("logger=")] + ["trainer.max_steps=20"]
    args = ["-m", "poslab.study.driver", str(mine / "study.yaml"), f"data.path={corpus}", *tiny]
    python([*args, "--out", str(out), "--jobs-per-device", "2"], empty, env, timeout=900)
    merged = json.loads((out / "comparison" / "comparison.json").read_text())
    assert {row["scheme"] for row in merged} == {"logdist", "alibi"}
    assert all(row["n_seeds"] == 2 and row["seeds"] == "1 2" for row in merged)
    text = (out / "comparison" / "comparison.md").read_text()
    assert "| logdist | 2 paired |" in text  # its differences to the baseline, paired by seed

    run = next((out / "runs").glob("logdist*1*"))
    refused = subprocess.run(
        [sys.executable, "-m", "poslab.hf.export", str(run), "--out", str(tmp_path / "hf")],
        cwd=empty, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    err = refused.stderr.strip().splitlines()
    assert len(err) == 1 and "outside poslab (POSLAB_USER)" in err[0], err
    assert not (tmp_path / "hf").exists()
