"""scripts/same_numbers.py: which commits share the computing code, and the bit-for-bit
comparison of two runs' checkpoints and evaluation rows (real runs of the shared tiny
training; a real git repository)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from poslab.study.same_numbers import code_states, first_difference, main


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
        cwd=repo,
        check=True,
    )
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """Five commits: the model; a report change; a docs change; a model change; a study change."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shas = [
        commit(repo, {"src/poslab/model/gpt.py": "a = 1\n"}, "model"),
        commit(repo, {"src/poslab/report/compare.py": "b = 1\n"}, "report"),
        commit(repo, {"docs/results.md": "# r\n"}, "docs"),
        commit(repo, {"src/poslab/model/gpt.py": "a = 2\n"}, "model again"),
        commit(repo, {"src/poslab/study/driver.py": "c = 1\n"}, "study"),
    ]
    return repo, shas


def test_commits_that_change_only_reports_docs_or_studies_share_a_code_version(history):
    repo, shas = history
    states = code_states(shas[0], shas[-1], repo)
    assert states == [(shas[0], shas[:3]), (shas[3], shas[3:])]
    # from the middle of the line: its own first commit heads the first group
    assert code_states(shas[1], shas[3], repo) == [(shas[1], shas[1:3]), (shas[3], [shas[3]])]


def test_a_commit_git_does_not_know_is_one_line(history, tmp_path, monkeypatch, capsys):
    repo, shas = history
    monkeypatch.chdir(repo)
    for args, said in (
        (["nosuch", "HEAD"], "FIRST nosuch is not a commit of"),
        ([shas[0], "nosuch"], "LAST nosuch is not a commit of"),
        ([shas[3], shas[0]], "holds no commit; give FIRST before LAST"),
    ):
        with pytest.raises(SystemExit) as stop:
            main([*args, "--pos", "rope", "--out", str(tmp_path / "out")])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


def test_two_runs_are_the_same_only_when_every_tensor_and_score_is(trained_runs, tmp_path):
    rope, _ = trained_runs["rope"]
    assert first_difference(rope, rope).startswith("same (")
    # another scheme of the same shapes: its weights differ
    said = first_difference(rope, trained_runs["alibi"][0])
    assert "differs (largest gap" in said, said
    # the same checkpoint with one evaluation value changed in its last digit
    copy = tmp_path / "copy"
    shutil.copytree(rope, copy)
    result = copy / "extrapolation" / "extrapolation.json"
    rows = json.loads(result.read_text())
    rows[-1]["ppl"] = rows[-1]["ppl"] * (1 + 1e-15) + 1e-12
    result.write_text(json.dumps(rows))
    said = first_difference(rope, copy)
    assert said.startswith("ppl at ") and said.endswith("differs"), said
    shutil.rmtree(copy / "extrapolation")
    assert first_difference(rope, copy) == "no result (see its log)"


@pytest.mark.slow  # starts processes: git worktrees and train.py at two commits
def test_a_change_to_the_model_code_is_found_and_one_to_the_docs_is_not(corpus, tmp_path):
    """In a clone of this repository: a docs commit and a model commit (another init scale)
    after HEAD. The docs commit shares HEAD's code version; the model commit's run differs.
    Each run is the checkout's own code, not the installed poslab's."""
    from conftest import REPO

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout.strip()
    commit(clone, {"docs/note.md": "a note\n"}, "docs")
    gpt = clone / "src" / "poslab" / "model" / "gpt.py"
    text = gpt.read_text()
    assert "std=0.02)" in text
    changed = text.replace("std=0.02)", "std=0.03)")
    last = commit(clone, {"src/poslab/model/gpt.py": changed}, "init")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(clone / "scripts" / "same_numbers.py"),
            head,
            last,
            "--pos",
            "rope",
            "--out",
            str(out),
            "--",
            "model=tiny",
            "data.seq_len=16",
            "data.batch_size=8",
            f"data.path={os.path.relpath(corpus, clone)}",  # relative to where it is run
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = (out / "same_numbers.md").read_text()
    assert "2 versions of the computing code" in done.stdout
    rows = [line for line in table.splitlines() if line.startswith(f"| {head[:10]}")]
    assert rows and "| 2 | same (" in rows[0], table
    rows = [line for line in table.splitlines() if line.startswith(f"| {last[:10]}")]
    assert rows and "differs (largest gap" in rows[0], table
    # a scheme the first version refuses: one line, before the other versions run
    refused = subprocess.run(
        [
            sys.executable,
            str(clone / "scripts" / "same_numbers.py"),
            head,
            last,
            "--pos",
            "nosuch",
            "--out",
            str(tmp_path / "bad"),
            "--",
            f"data.path={corpus}",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    err = refused.stderr.strip().splitlines()
    assert len(err) == 1 and f"error: the run of nosuch at {head[:10]} failed (" in err[0], err
    assert not (tmp_path / "bad" / "runs" / last[:10]).exists()
