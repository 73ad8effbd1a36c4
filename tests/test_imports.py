"""The package's structure, checked from its own imports (scripts/imports.py draws it)."""

from __future__ import annotations

import importlib.util
import sys

from conftest import REPO

spec = importlib.util.spec_from_file_location("poslab_imports", REPO / "scripts" / "imports.py")
imports = importlib.util.module_from_spec(spec)
sys.modules["poslab_imports"] = imports
spec.loader.exec_module(imports)


def test_no_import_circle_counting_imports_inside_functions():
    assert imports.cycles(imports.import_graph()) == []


def test_every_import_runs_down_or_across_a_floor():
    assert imports.upward_imports(imports.import_graph()) == []


def test_no_forbidden_import():
    """Issue #60: export reads a run, not an evaluation; tasks know no model."""
    assert imports.forbidden_imports(imports.import_graph()) == []


def test_the_check_finds_the_forbidden_imports(tmp_path):
    """The two imports issue #60 removed, put back in a made-up package, are found (both run
    down the floors, so the upward check alone passes them)."""
    package = tmp_path / "poslab"
    for folder in ("hf", "evaluation", "tasks", "model"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "evaluation" / "run.py").write_text("")
    (package / "model" / "losses.py").write_text("IGNORE_INDEX = -100\n")
    (package / "hf" / "export.py").write_text(
        "def export():\n    from poslab.evaluation.run import checkpoint_of_run\n"
    )
    (package / "tasks" / "__init__.py").write_text("from poslab.model.losses import IGNORE_INDEX\n")
    graph = imports.import_graph(tmp_path)
    assert imports.upward_imports(graph) == []
    assert imports.forbidden_imports(graph) == [
        "poslab.hf.export imports poslab.evaluation.run",
        "poslab.tasks imports poslab.model.losses",
    ]


def test_every_module_has_a_floor():
    for name in imports.import_graph():
        imports.floor_of(name)  # raises for a module no floor names


def test_the_check_finds_a_circle_and_an_upward_import(tmp_path):
    """The check itself, on a made-up package: a → b → a inside a function, and a scheme that
    reaches up to the analysis package."""
    package = tmp_path / "poslab"
    (package / "positions").mkdir(parents=True)
    (package / "analysis").mkdir()
    (package / "__init__.py").write_text("")
    (package / "positions" / "__init__.py").write_text("")
    (package / "analysis" / "__init__.py").write_text("from poslab.positions import rope\n")
    (package / "positions" / "rope.py").write_text(
        "def after_training():\n    from poslab.analysis import plot\n"
    )
    graph = imports.import_graph(tmp_path)
    assert graph["poslab.positions.rope"] == {"poslab.analysis"}
    assert imports.cycles(graph) == [["poslab.analysis", "poslab.positions.rope"]]
    assert imports.upward_imports(graph) == [
        "poslab.positions.rope (floor 2) imports poslab.analysis (floor 7)"
    ]


def test_the_report_floor_imports_no_torch():
    """A report is re-made from files without a model: importing every module of report/ (and
    everything they import at the top) loads no torch and no Lightning."""
    import subprocess

    names = sorted(n for n in imports.import_graph() if n.startswith("poslab.report"))
    assert "poslab.report.compare" in names and "poslab.report.files" in names
    code = (
        "import sys\n"
        + "".join(f"import {n}\n" for n in names)
        + "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_function_is_over_60_lines():
    """The house rule (docs/structure.md): a function fits on a screen. Counted from `def` to
    its last line, decorators aside, over the package, the scripts and the two shims."""
    import ast

    files = [*sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py"))]
    files += [REPO / "train.py", REPO / "eval.py"]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} {lines}")
    assert long == []
