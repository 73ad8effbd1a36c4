"""The import structure of poslab, drawn from the code: every `import` of a poslab module, at the
top of a file or inside a function, as an edge; its cycles; and each edge checked against the
floors below (a module imports only from its own floor or lower ones).

    python scripts/imports.py          # the floors, each module's imports, and any problem

tests/test_imports.py runs the same check, so an import circle, an import that runs back up or
one of the FORBIDDEN imports fails the test suite.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module belongs to the floor of the package it is in (the root package `poslab`,
# whose __init__ every import runs, only registers Hydra resolvers: the ground floor).
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground: errors and checks (the root package's own modules)",
        (
            "poslab",
            "poslab.conf",
            "poslab.errors",
            "poslab.names",
            "poslab.checks",
            "poslab.arguments",
            "poslab.instantiate",
            "poslab.plotting",  # matplotlib helpers every figure uses (the θ plot of a scheme too)
            "poslab.targets",  # IGNORE_INDEX: what tasks write and the loss skips
            "poslab.user",  # POSLAB_USER: a researcher's own scheme folders
            # the floor folders' own __init__ (a docstring each)
            "poslab.model",
            "poslab.run",
            "poslab.hf",
            "poslab.report",
        ),
    ),
    ("devices and numbers (model/)", ("poslab.model.precision", "poslab.model.losses")),
    (
        "parts: schemes, kernels, tasks, data",
        (
            "poslab.positions",
            "poslab.model.attention",
            "poslab.model.linear_attention",
            "poslab.tasks",
            "poslab.data",
        ),
    ),
    ("the model (model/)", ("poslab.model.gpt", "poslab.model.build")),
    ("a run: checks, Lightning, tracking, the Hydra app (run/)", ("poslab.run",)),
    (
        "reporting: tables, figures, files, compare, intervals; no torch (report/)",
        ("poslab.report",),
    ),
    (
        "evaluation (evaluation/, hf/)",
        (
            "poslab.evaluation",
            "poslab.hf.pretrained",
            "poslab.hf.pretrained_attention",
            "poslab.hf.tiny_hf",  # the tiny HF models pretrained.py is checked on (tests, parity)
        ),
    ),
    (
        "analysis and the commands",
        (
            "poslab.analysis",
            "poslab.apps",
            "poslab.bench",
            "poslab.hf.export",
            "poslab.hf.bundle",
            "poslab.hf.remote",  # written into an exported folder: relative imports only
            "poslab.study",
            "poslab.positions.properties",  # the property checks: tiny GPTs, perplexity
        ),
    ),
]


# Imports the floors allow but the design does not: (importer, imported), each a module or a
# package and all it holds. An export is a run's checkpoint and tokenizer, not an evaluation
# (what both need lives in run/ and data/); a task makes targets and knows no model (the
# ignored target is poslab.targets).
FORBIDDEN: list[tuple[str, str]] = [
    ("poslab.hf.export", "poslab.evaluation"),
    ("poslab.tasks", "poslab.model"),
]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    """Edges that FORBIDDEN names, whatever their floors."""
    return [
        f"{a} imports {b}"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if any(_within(a, importer) and _within(b, imported) for importer, imported in FORBIDDEN)
    ]


def floor_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(FLOORS):
        if module in prefixes:  # a module named on its own floor (inside a lower package)
            return index
    for index, (_, prefixes) in enumerate(FLOORS):
        # the ground floor names modules (and packages' own __init__) one by one: a new module
        # must be given a floor; every other floor names packages and all they hold
        if any(module == p or (index > 0 and module.startswith(p + ".")) for p in prefixes):
            return index
    raise ValueError(f"{module} has no floor in scripts/imports.py FLOORS; add it")


def modules(src: Path = SRC) -> dict[str, Path]:
    found = {}
    for path in sorted((src / "poslab").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, path: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [f"{module}.{alias.name}" for alias in node.names] + [module]


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the poslab modules it imports (anywhere in the file)."""
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, name, path):
                while target and target not in known:  # `from a.b import name`: the module a.b
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)  # a package's own __init__ is not an edge
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Edges that run from a lower floor to a higher one."""
    return [
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if floor_of(b) > floor_of(a)
    ]


def main() -> int:
    graph = import_graph()
    for index, (title, _) in enumerate(FLOORS):
        print(f"\nfloor {index}: {title}")
        for name in sorted(m for m in graph if floor_of(m) == index):
            print(f"  {name:34s} -> {', '.join(sorted(graph[name])) or '-'}")
    problems = [f"import circle: {' <-> '.join(c)}" for c in cycles(graph)]
    problems += [f"runs back up: {edge}" for edge in upward_imports(graph)]
    problems += [f"forbidden: {edge}" for edge in forbidden_imports(graph)]
    edges = sum(len(v) for v in graph.values())
    print(f"\n{len(graph)} modules, {edges} imports, {len(problems)} problems")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
