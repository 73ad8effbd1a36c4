"""Do two code versions compute the same numbers? A study run over days collects rows from many
commits; this checks, by running them, that every commit between two computes what the first
does, to the last bit:

    python scripts/same_numbers.py 5fa6630 HEAD --pos sinusoidal rope t5 alibi --out DIR \\
        -- experiment=paper_cpu data.path=../shared/data/wikitext-2   # paths: from where it runs

The first-parent commits FIRST..LAST are grouped by the code that computes (src/poslab without
the modules that only report, plan or export: `REPORT_ONLY`); the first commit of each group is
checked out (a git worktree under DIR) and runs one short `train.py` per scheme with the given
overrides and `SHORT` (a few steps, one validation, a small evaluation beyond L), one thread.
Every group's best checkpoint (every tensor) and evaluation rows (every loss and perplexity)
are then compared with the first group's: DIR/same_numbers.md says, per group and scheme,
"same" or the first difference. A short run is a check of the code path, not of the study's
length: it shows that the same inputs give the same bits.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error

# modules that write tables and figures, plan studies or export models: a change in them cannot
# change a trained model or its evaluation rows (the checked runs compare those, not reports)
REPORT_ONLY = ("report/", "study/", "bench/", "hf/", "analysis/")
# a short run that still goes through training, a validation, the checkpoint and the evaluation
# at 1x and 4x L in the experiment's modes (context use included where the experiment has it)
SHORT = [
    "trainer.max_steps=6",
    "trainer.val_check_interval=6",
    "trainer.limit_val_batches=2",
    "eval.max_tokens=4096",
    "eval.factors=[1,4]",
    "logger=csv",
    "trainer.enable_progress_bar=false",
]
# every number of an evaluation row (a field one version does not write is left out)
# `python <checkout>/train.py ...` with the checkout's src/ as the only poslab (and
# hydra_plugins) on the path: an editable install of another checkout would otherwise load its
# Hydra plugin. It runs in the caller's directory, so a relative data.path means what it says.
LAUNCH = (
    "import os, runpy, sys; sys.argv = sys.argv[1:]; "
    "own = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), 'src'); "
    "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') == own "
    "or not os.path.isdir(os.path.join(p or '.', 'poslab'))]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
SCORES = (
    "nll",
    "loss",
    "ppl",
    "word_ppl",
    "bits_per_byte",
    "loss_by_position",
    "context_gain",
    "gain_by_distance",
)


def git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1]}")
    return done.stdout.strip()


def code_states(first: str, last: str, repo: Path) -> list[tuple[str, list[str]]]:
    """(the first commit, every commit) of each run of first-parent commits from `first` to
    `last` whose computing code (src/poslab without REPORT_ONLY) is the same."""
    for name, given in (("FIRST", first), ("LAST", last)):
        found = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}"],
            cwd=repo,
            capture_output=True,
        )
        if found.returncode != 0:
            raise ConfigError(f"{name} {given} is not a commit of {repo}; see git log")
    line = git("rev-list", "--first-parent", "--reverse", last, cwd=repo).split()
    start = git("rev-parse", f"{first}^{{commit}}", cwd=repo)
    if start not in line:
        raise ConfigError(
            f"{first}..{last} holds no commit; give FIRST before LAST, on LAST's first-parent line"
        )
    states: list[tuple[str, str, list[str]]] = []
    for sha in line[line.index(start) :]:
        listing = git("ls-tree", "-r", sha, "src/poslab", cwd=repo).splitlines()
        kept = [line for line in listing if not line.split("\t")[1][11:].startswith(REPORT_ONLY)]
        key = hashlib.sha256("\n".join(kept).encode()).hexdigest()
        if states and states[-1][1] == key:
            states[-1][2].append(sha)
        else:
            states.append((sha, key, [sha]))
    return [(sha, members) for sha, _, members in states]


def run_state(sha: str, schemes: list[str], overrides: list[str], out: Path, repo: Path) -> None:
    """One short train.py per scheme at commit `sha` (a worktree under `out`), one thread."""
    tree = out / "worktrees" / sha[:10]
    if not tree.exists():
        git("worktree", "add", "--detach", str(tree), sha, cwd=repo)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "src"),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "POSLAB_CACHE": str(out / "cache" / sha[:10]),  # each version tokenizes on its own
    }
    for given in schemes:
        scheme, *own = given.split(",")  # a scheme and its own overrides
        run = out / "runs" / sha[:10] / scheme
        if (run / "extrapolation" / "extrapolation.json").exists():
            continue  # done by an earlier call: the same command again resumes
        started = time.monotonic()
        log = out / "logs" / f"{sha[:10]}-{scheme}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-c",
            LAUNCH,
            str(tree.resolve() / "train.py"),
            f"pos={scheme}",
            *overrides,
            *own,
            *SHORT,
            f"hydra.run.dir={run}",
        ]
        with log.open("w") as handle:
            code = subprocess.call(command, env=env, stdout=handle, stderr=handle)
        took = time.monotonic() - started
        print(f"{sha[:10]} {scheme}: exit {code} in {took:.0f} s (log {log})", flush=True)


def _check_reference(sha: str, schemes: list[str], out: Path) -> None:
    """A ConfigError where a run of the first version has no result (a scheme or an override
    its train.py refuses): every other version would fail the same way, minutes later."""
    from poslab.study.driver import last_error_line

    for scheme in (s.split(",")[0] for s in schemes):
        if not (out / "runs" / sha[:10] / scheme / "extrapolation" / "extrapolation.json").exists():
            log = out / "logs" / f"{sha[:10]}-{scheme}.log"
            why = last_error_line(log) or "no evaluation"
            raise ConfigError(f"the run of {scheme} at {sha[:10]} failed ({why}); see {log}")


def scheme_outputs(run: Path) -> tuple[dict[str, Any], list[dict]]:
    """The best checkpoint's tensors and the evaluation rows of one short run."""
    import torch

    ckpt = next((run / "checkpoints").glob("best*.ckpt"), None)
    tensors = {}
    if ckpt is not None:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
        tensors = {k: v for k, v in state.items() if torch.is_tensor(v)}
    result = run / "extrapolation" / "extrapolation.json"
    rows = json.loads(result.read_text()) if result.exists() else []
    return tensors, rows


def first_difference(reference: Path, other: Path) -> str:
    """'same', or the first tensor or evaluation value in which `other` differs."""
    import torch

    tensors_a, rows_a = scheme_outputs(reference)
    tensors_b, rows_b = scheme_outputs(other)
    if not tensors_a or not rows_a:
        return "the reference run has no result"
    if not tensors_b or not rows_b:
        return "no result (see its log)"
    if tensors_a.keys() != tensors_b.keys():
        return f"other parameters: {sorted(tensors_a.keys() ^ tensors_b.keys())[:3]}"
    for name, value in tensors_a.items():
        if value.shape != tensors_b[name].shape or not torch.equal(value, tensors_b[name]):
            gap = (value.float() - tensors_b[name].float()).abs().max().item()
            return f"{name} differs (largest gap {gap:.3g})"
    cells = lambda rows: {(r["mode"], r["length"]): r for r in rows}  # noqa: E731
    a, b = cells(rows_a), cells(rows_b)
    if a.keys() != b.keys():
        return f"other cells: {sorted(a.keys() ^ b.keys())[:3]}"
    for key, row in a.items():
        for field in (f for f in SCORES if f in row and f in b[key]):
            if row[field] != b[key][field]:
                return f"{field} at {key[0]} {key[1]} differs"
    return f"same ({len(tensors_a)} tensors, {len(a)} cells)"


def same_numbers(
    first: str, last: str, schemes: list[str], overrides: list[str], out: Path
) -> list[list[str]]:
    repo = Path(git("rev-parse", "--show-toplevel"))
    states = code_states(first, last, repo)
    print(f"{len(states)} versions of the computing code in {first}..{last}", flush=True)
    for k, (sha, _) in enumerate(states):
        run_state(sha, schemes, overrides, out, repo)
        if k == 0:
            _check_reference(sha, schemes, out)
    reference = states[0][0]
    given, schemes = schemes, [s.split(",")[0] for s in schemes]
    table = []
    for sha, members in states:
        verdicts = [
            first_difference(out / "runs" / reference[:10] / s, out / "runs" / sha[:10] / s)
            for s in schemes
        ]
        table.append([sha[:10], str(len(members)), *verdicts])
    header = ["code version (first commit)", "commits", *schemes]
    lines = [
        f"# Same numbers from {first} to {last}?",
        "",
        f"Each version against {reference[:10]}: `train.py pos=SCHEME {' '.join(overrides)}` "
        f"(per scheme: {'; '.join(g.replace(',', ' ') for g in given)}) "
        f"with `{' '.join(SHORT)}`, one thread, compared bit for bit (every checkpoint "
        "tensor, every evaluation loss and perplexity).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in table),
    ]
    (out / "same_numbers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return table


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/same_numbers.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="the commit the others are compared with")
    parser.add_argument("last", help="the last commit (first-parent line from FIRST)")
    parser.add_argument(
        "--pos",
        nargs="+",
        required=True,
        help="schemes to run at each version; a scheme's own overrides after commas: "
        "SCHEME,model.scale_embeddings=true",
    )
    parser.add_argument("--out", required=True, help="folder for worktrees, runs and the table")
    args, overrides = parser.parse_known_args(argv)  # the rest: train.py overrides
    overrides = [o for o in overrides if o != "--"]
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    out = Path(args.out)
    check_writable(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    same_numbers(args.first, args.last, args.pos, overrides, out.resolve())
