"""The documentation cannot go stale: every option table in docs/ names exactly the config files
and keys it documents, every relative link points at a file that exists, and the README's test
command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import CONF
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# config groups a user picks from (hydra/ is Hydra's own settings; eval/ holds one file)
GROUPS = (
    "pos",
    "model",
    "attention",
    "data",
    "trainer",
    "logger",
    "eval",
    "experiment",
    "callbacks",
)


def _stems(group: str) -> set[str]:
    return {p.stem for p in (CONF / group).glob("*.yaml")}


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def _ticked(cell: str) -> list[str]:
    """The words inside `backticks` of a cell (a backticked run of several words gives each)."""
    return [word for span in re.findall(r"`([^`]+)`", cell) for word in span.split()]


def test_the_scheme_table_names_every_scheme_of_conf_pos_and_no_other():
    options = (DOCS / "options.md").read_text()
    section = options.split("## Positional schemes", 1)[1].split("\n## ", 1)[0]
    rows = _table_rows(section, "| `pos=`")
    assert {_ticked(cells[0])[0] for cells in rows} == _stems("pos")


def test_the_config_group_table_lists_exactly_the_files_of_each_group():
    rows = _table_rows((DOCS / "options.md").read_text(), "| group | options")
    table = {_ticked(cells[0])[0]: cells[1] for cells in rows}
    assert set(table) == set(GROUPS)
    for group, cell in table.items():
        # the options cell names files; a dotted word is an option key, a slashed one a folder
        named = {w for w in _ticked(cell) if not set(w) & set("./=")}
        assert named == _stems(group), (group, named ^ _stems(group))


def _keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _keys(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def test_the_eval_option_table_documents_every_key_of_conf_eval():
    rows = _table_rows((DOCS / "evaluation.md").read_text(), "| option |")
    documented: set[str] = set()
    for cells in rows:
        words = _ticked(cells[0].replace(",", " "))
        parent = ""
        for word in words:
            # `eval.rope_scaling.beta_fast`, `.beta_slow`: a leading dot continues the parent
            full = parent + word if word.startswith(".") else word
            parent = full.rsplit(".", 1)[0]
            documented.add(full.strip("/"))
    config = OmegaConf.to_container(OmegaConf.load(CONF / "eval" / "default.yaml"))
    missing = [k for k in _keys(config) if f"eval.{k}" not in documented]
    assert not missing, f"docs/evaluation.md's option table lacks {missing}"


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize(
    "page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name
)
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                broken.append(link)
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^(python -m pytest -m \"not slow\".*)$", readme, flags=re.M)
    assert command, "README.md gives no test command"
    assert command.group(1) in (REPO / ".ci" / "run").read_text()


def test_no_script_writes_into_the_committed_tree_unless_told_to(tmp_path):
    """A newcomer's `git status` stays clean: the analysis figures, the benchmark page and a
    comparison of a committed study go under outputs/ unless --out names a committed folder."""

    from poslab.analysis import DEFAULT_OUT
    from poslab.bench.configs import DEFAULT_OUT as BENCH_OUT
    from poslab.bench.generation import DEFAULT_OUT as GENERATION_OUT
    from poslab.report.compare import default_out

    assert DEFAULT_OUT.parts[0] == "outputs"
    assert BENCH_OUT.parts[0] == "outputs"
    assert GENERATION_OUT.parts[0] == "outputs"
    committed = str(REPO / "docs" / "results" / "headline_cpu" / "comparison.json")
    assert default_out([committed]) == Path("outputs") / "comparison" / "headline_cpu"
    sweep = tmp_path / "outputs" / "multirun" / "sweep"
    assert default_out([str(sweep)]) == sweep / "comparison"  # a sweep's own comparison
