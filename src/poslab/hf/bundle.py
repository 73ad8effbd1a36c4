"""poslab's model code, written into an exported folder so that the folder alone runs it: the
custom-code path of the export (export.py) for every scheme with no native HF architecture.

The folder gets the modules that build and run a GPT (poslab.model's network and kernels, every
scheme of poslab.positions and every RoPE extension kind, and the small modules beneath them),
each as one flat file `poslab_<dotted path>.py` with its `poslab.` imports made relative, which
is the form Hugging Face's remote-code loader copies and imports (`from .poslab_x import y`).
What those modules reach outside torch, transformers (and its numpy) and the standard library:

* Hydra and OmegaConf (building a config node, reading one): `poslab_shim.py` (remote/), a few
  lines that build a `_target_` from the bundled modules;
* the registries, which read conf/ YAML files (the schemes of conf/pos/, which a per-layer
  schedule builds from; the extension kinds of conf/extension/): generated modules holding
  those files' contents as resolved here, at export;
* plots (matplotlib, poslab.plotting) and an optional GPU kernel (fla), imported inside the
  functions that use them: written as `importlib.import_module` calls, so the loader does not
  demand those packages and a call that needs one fails with ImportError as it would anywhere.

The code is poslab's own, not a port: the exported model computes what poslab computes by
construction, and the equality test (tests/hf/test_remote_code.py) holds it to 1e-5.
"""

from __future__ import annotations

import ast
import functools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import poslab

PACKAGE = Path(poslab.__file__).resolve().parent
REMOTE = Path(__file__).resolve().parent / "remote"  # the modeling files copied as they are
# the bundled modules beneath the schemes, by dotted name; module_names adds every module of
# positions/ and positions/extensions/
BUNDLED = (
    "poslab.errors",
    "poslab.checks",
    "poslab.instantiate",
    "poslab.targets",  # IGNORE_INDEX, which model/losses.py reads
    "poslab.model.precision",
    "poslab.model.losses",
    "poslab.model.attention",
    "poslab.model.linear_attention",
    "poslab.model.gpt",
)
# generated here instead of copied: registries over conf/ YAML files
GENERATED = ("poslab.positions", "poslab.positions.extensions")
# what Hydra and OmegaConf imports become
SHIM = "poslab_shim"
SHIMMED = ("hydra", "omegaconf")
# packages an exported folder may import: its requirements (numpy comes with transformers)
ALLOWED = {"torch", "transformers", "numpy", "__future__"} | set(sys.stdlib_module_names)


def flat_name(module: str) -> str:
    """poslab.positions.rope -> poslab_positions_rope (the bundled file's module name)."""
    return module.replace(".", "_")


def module_names() -> list[str]:
    """Every bundled module: BUNDLED, every scheme and every extension kind."""
    schemes = sorted(
        f"poslab.positions.{p.stem}"
        for p in (PACKAGE / "positions").glob("*.py")
        if p.stem != "__init__"
    )
    kinds = sorted(
        f"poslab.positions.extensions.{p.stem}"
        for p in (PACKAGE / "positions" / "extensions").glob("*.py")
        if p.stem != "__init__"
    )
    return list(dict.fromkeys([*BUNDLED, *schemes, *kinds]))


def source_file(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def rewrite(source: str, bundled: set[str], origin: str) -> str:
    """`source` with its imports in the folder's form: bundled poslab modules relative, Hydra
    and OmegaConf from the shim, anything else not ALLOWED imported by importlib inside the
    function that needs it. A module-level import of such a package cannot run without it: an
    error here (a bug of the bundle's module list, not a user's input)."""
    lines = source.splitlines(keepends=True)
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        new = _rewritten(node, bundled, origin)
        if new is None:
            continue
        indent = lines[node.lineno - 1][: node.col_offset]
        lines[node.lineno - 1 : node.end_lineno] = [indent + new + "\n"]
    return "".join(lines)


def _rewritten(node: ast.Import | ast.ImportFrom, bundled: set[str], origin: str) -> str | None:
    """The statement that replaces an import (None: it stays as it is)."""
    if isinstance(node, ast.ImportFrom) and node.level:
        raise ValueError(f"{origin}: relative import at line {node.lineno}; poslab uses absolute")
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    module = node.module if isinstance(node, ast.ImportFrom) else None
    top = (module or node.names[0].name).split(".")[0]
    if isinstance(node, ast.ImportFrom) and top == "poslab" and module in bundled:
        return f"from .{flat_name(module)} import {names}"
    if top in SHIMMED and isinstance(node, ast.ImportFrom):
        return f"from .{SHIM} import {names}"
    if top in ALLOWED:
        return None
    if node.col_offset == 0:
        raise ValueError(f"{origin}: module-level import of {top} (line {node.lineno})")
    load = '__import__("importlib").import_module'
    if isinstance(node, ast.Import):
        return "; ".join(
            f'{a.asname or a.name.split(".")[0]} = {load}("{a.name if a.asname else top}")'
            for a in node.names
        )
    targets = ", ".join(a.asname or a.name for a in node.names)
    values = ", ".join(f"_module.{a.name}" for a in node.names)
    return f'_module = {load}("{module}"); {targets} = {values}'


def write_bundle(folder: Path, scheme_configs: dict[str, Any], kinds: dict[str, Any]) -> None:
    """The modules of the model code into `folder` (see the module's docstring), with the
    registries generated from `scheme_configs` (name -> resolved config of conf/pos/) and
    `kinds` (name -> conf/extension/<name>.yaml's contents)."""
    modules = module_names()
    for module, text in bundled_sources().items():
        (folder / f"{flat_name(module)}.py").write_text(text)
    for name in ("configuration_poslab.py", "modeling_poslab.py", f"{SHIM}.py"):
        shutil.copyfile(REMOTE / name, folder / name)
    (folder / f"{flat_name(GENERATED[0])}.py").write_text(
        POSITIONS.format(configs=json.dumps(scheme_configs, indent=1, sort_keys=True))
    )
    (folder / f"{flat_name(GENERATED[1])}.py").write_text(
        EXTENSIONS.format(kinds=json.dumps(kinds, indent=1, sort_keys=True))
    )
    imports = "\n".join(
        f"from .{flat_name(m)} import __name__ as _{i}" for i, m in enumerate(modules)
    )
    (folder / "poslab_modules.py").write_text(MODULES.format(imports=imports))


@functools.cache
def bundled_sources() -> dict[str, str]:
    """module -> its source in the folder's form (the same for every export of a process)."""
    modules = module_names()
    bundled = set(modules) | set(GENERATED)
    return {m: rewrite(source_file(m).read_text(), bundled, m) for m in modules}


# The registries as generated modules: what conf/ holds, as JSON, read at export
POSITIONS = '''"""conf/pos/ as poslab's export resolved it (the folder has no conf/): the
registry a per-layer schedule builds its members from (poslab.positions.scheme_configs)."""

import copy
import json

CONFIGS = json.loads(r"""{configs}""")


def scheme_names() -> list:
    return sorted(CONFIGS)


def scheme_configs(seq_len: int = 64) -> dict:
    """name -> resolved config; the lengths were resolved for the run's training length."""
    return copy.deepcopy(CONFIGS)
'''

EXTENSIONS = '''"""conf/extension/ as poslab's export read it (the folder has no conf/): the
RoPE extension kinds (poslab.positions.extensions), each its class and its options' defaults."""

import json

from .poslab_errors import ConfigError
from .poslab_shim import get_class

KINDS = json.loads(r"""{kinds}""")


def extension_names() -> tuple:
    return tuple(sorted(KINDS, key=lambda n: (n != "none", n)))


def extension_defaults(kind):
    if not isinstance(kind, str) or kind not in KINDS:
        raise ConfigError(
            f"rope_scaling.kind={{kind!r}}; choose one of {{', '.join(extension_names())}}"
        )
    options = dict(KINDS[kind])
    return get_class(options.pop("_target_")), options


def option_owners() -> dict:
    owners = {{}}
    for kind in extension_names():
        for option in extension_defaults(kind)[0].option_names():
            owners.setdefault(option, []).append(kind)
    return owners
'''

MODULES = '''"""Every module of the model code, imported by name so that Hugging Face's
loader copies each (it follows relative imports); the shim builds `_target_`s from them."""

{imports}
'''
