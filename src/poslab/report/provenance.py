"""What a table's numbers rest on, and the rule for merging seeds into one row.

Every row of an extrapolation.json written since 2026-12-06 carries `provenance`: the word
vocabulary's version, the corpus, the code version, the model, its steps and training tokens, and
the training precision (`provenance_of_config`), and since 2026-12-07 the machine that trained it
(its run.json; "not recorded" before). Rows written before it get the same fields from
their run's saved config where it is at hand (`provenance_of_run`); what cannot be known is None.

compare.py holds a table to two rules:
* **one vocabulary and one corpus per table** (`check_one_vocabulary`): perplexities over two
  vocabularies or two corpora are not comparable numbers, so mixing them is refused in one line
  unless asked (`--mixed-vocabularies`), and then the table says so;
* **seeds of one row were scored alike** (`check_seeds_scored_alike`): the same split, token cap
  and tokens, lengths and modes, precision, position offset, stride, eval-time variant and
  context-use length. A row whose seeds differ in any of these is refused in one line naming the
  setting and the runs: its mean would be no number of any one evaluation.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError

# a version-1 vocabulary is what every word-level run before the fix had (data/tokens.py)
FIRST_VOCABULARY = 1
PROVENANCE_FIELDS = (
    "vocabulary",
    "corpus",
    "code",
    "model",
    "params",
    "steps",
    "train_tokens",
    "train_precision",
    "machine",
)
# what each seed of a row must share, read from each seed's rows (one value per seed)
SCORED_ALIKE = (
    "split",
    "max_tokens",
    "precision",
    "position_offset",
    "variant",
    "short_context",
    "word_level",
)
# per (mode, length) cell: what each seed's row of that cell must share
SCORED_ALIKE_PER_CELL = ("tokens", "stride", "documents")


@functools.cache
def code_version() -> str:
    """The code that made a result: `git <short sha>` of poslab's checkout (`+changes` where its
    tracked files differ from that commit), else the installed package's version."""
    root = Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "src"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return f"git {sha}{'+changes' if changed else ''}"
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"poslab {version('poslab')}"
        except PackageNotFoundError:
            return "unknown"


def provenance_of_config(
    config: dict[str, Any],
    params: int | None = None,
    precision: str | None = None,
    machine: str | None = None,
) -> dict[str, Any]:
    """The provenance of rows of a model trained with the resolved `config` (on `machine`)."""
    data, trainer = config.get("data") or {}, config.get("trainer") or {}
    text = not data.get("task")
    steps = trainer.get("max_steps")
    tokens = None
    if isinstance(steps, int) and data.get("batch_size") and data.get("seq_len"):
        tokens = steps * data["batch_size"] * data["seq_len"]
        tokens *= trainer.get("accumulate_grad_batches") or 1
    max_tokens = (config.get("train") or {}).get("max_tokens")
    return {
        "vocabulary": (data.get("tokenizer_version") or FIRST_VOCABULARY) if text else None,
        "corpus": data.get("name") or data.get("task"),
        "code": code_version(),
        "model": config.get("model_name"),
        "params": params,
        "steps": steps,
        "train_tokens": max_tokens or tokens,
        "train_precision": precision or trainer.get("precision"),
        "machine": machine,
    }


def provenance_of_run(run: Path, rows: list[dict]) -> dict[str, Any]:
    """The rows' own provenance, else what the run's saved config says (an eval.py out_dir: the
    config beside it, else the evaluated run's), the code version unknown."""
    given = next((r["provenance"] for r in rows if isinstance(r.get("provenance"), dict)), None)
    if given is not None:
        return given
    config = _saved_config(run)
    if config is None:
        return dict.fromkeys(PROVENANCE_FIELDS)
    found = provenance_of_config(config)
    found["code"] = None  # not recorded then
    found["params"] = None
    record = run_record(run)
    found["train_precision"] = record.get("precision") or found["train_precision"]
    found["machine"] = record.get("machine")  # written since 2026-12-07
    if isinstance(found["model"], str) and found["model"].startswith("${"):
        found["model"] = record.get("model")  # the saved config has the interpolation
    return found


def run_record(run: Path | None) -> dict[str, Any]:
    """A run folder's run.json (an eval.py out_dir: the evaluated run's), or {}: the training
    precision (`auto` resolved) and, since 2026-12-07, the machine that trained it."""
    from poslab.report.files import evaluated_run

    for folder in (run, None if run is None else evaluated_run(Path(run))):
        with contextlib.suppress(OSError, ValueError, TypeError):
            record = json.loads((Path(folder) / "run.json").read_text())  # type: ignore[arg-type]
            if isinstance(record, dict):
                return record
    return {}


def _saved_config(run: Path) -> dict[str, Any] | None:
    from poslab.report.files import evaluated_run

    for folder in (run, evaluated_run(run)):
        path = None if folder is None else folder / ".hydra" / "config.yaml"
        if path is not None and path.is_file():
            from omegaconf import OmegaConf

            try:
                config = OmegaConf.load(path)
                return OmegaConf.to_container(config, resolve=False)  # type: ignore[return-value]
            except Exception:  # an unreadable config: nothing known  # noqa: BLE001
                return None
    return None


def check_one_vocabulary(rows: list[dict], allow_mixed: bool) -> str:
    """A ConfigError where the text rows of one table come from two vocabularies or corpora
    (unless `allow_mixed`); returns the note the table then carries ('' when they agree)."""
    text = [r for r in rows if not r.get("task")]
    found: dict[tuple[Any, Any], str] = {}
    for r in text:
        prov = r.get("provenance") or {}
        found.setdefault((prov.get("corpus"), prov.get("vocabulary")), r["scheme"])
    # a row that records neither (a table of before the record) conflicts with none
    corpora = {c for c, _ in found if c is not None}
    vocabularies = {v for _, v in found if v is not None}
    if len(corpora) < 2 and len(vocabularies) < 2:
        return ""
    found = {k: v for k, v in found.items() if k != (None, None)}
    described = [
        f"{row} ({corpus or 'corpus not recorded'}, vocabulary "
        f"{vocabulary if vocabulary is not None else 'not recorded'})"
        for (corpus, vocabulary), row in found.items()
    ]
    if not allow_mixed:
        raise ConfigError(
            "these rows come from different vocabularies or corpora, whose perplexities are "
            f"not comparable: {'; '.join(described[:2])}; compare one at a time, or pass "
            "--mixed-vocabularies to put them in one table (it then says so)"
        )
    return (
        "\n\n**Mixed vocabularies or corpora** (`--mixed-vocabularies`): "
        + "; ".join(described)
        + ". Perplexities of different vocabularies are not comparable numbers; read each "
        "difference between such rows as a difference of set-ups, not of schemes.\n"
    )


def check_seeds_scored_alike(name: str, members: list[tuple[Any, list[dict], Path]]) -> None:
    """A ConfigError where the seeds of row `name` ([(seed, rows, run folder)]) were scored
    under different evaluation settings (module docstring)."""
    if len(members) < 2:
        return
    where = [str(run) for _, _, run in members]
    if len(set(where)) < len(where):
        twice = next(w for w in where if where.count(w) > 1)
        raise ConfigError(f"row {name}: {twice} is given twice; pass each run once")
    for key in ("vocabulary", "corpus"):  # never merged, whatever --per-seed says
        values = [(rows[0].get("provenance") or {}).get(key) for _, rows, _ in members]
        if len({repr(v) for v in values if v is not None}) > 1:
            _refuse(name, key, members, values)
    for key in SCORED_ALIKE:
        values = [_one_value(rows, key) for _, rows, _ in members]
        if len({repr(v) for v in values}) > 1:
            _refuse(name, key, members, values)
    cells = [
        {(r["mode"], r["length"]) for r in rows if r.get("status") != "missing"}
        for _, rows, _ in members
    ]
    if len({tuple(sorted(c)) for c in cells}) > 1:
        values = [", ".join(f"{m} {n}" for m, n in sorted(c)) for c in cells]
        _refuse(name, "lengths and modes", members, values)
    for key in SCORED_ALIKE_PER_CELL:
        for cell in cells[0]:
            values = [
                next((r.get(key) for r in rows if (r["mode"], r["length"]) == cell), None)
                for _, rows, _ in members
            ]
            if len({repr(v) for v in values}) > 1:
                _refuse(name, f"{key} at {cell[0]} {cell[1]}", members, values)


def _one_value(rows: list[dict], key: str) -> Any:
    values = {repr(r.get(key)): r.get(key) for r in rows}
    return next(iter(values.values())) if len(values) == 1 else sorted(values)


def _refuse(name: str, key: str, members: list, values: list) -> None:
    shown = "; ".join(
        f"seed {seed} ({run}): {value}"
        for (seed, _, run), value in zip(members, values, strict=True)
    )
    raise ConfigError(
        f"row {name}: its seeds were scored with different {key} ({shown}); a mean over them is "
        "no number of one evaluation: re-score them alike (eval.py run=RUN with the same eval.* "
        "options) or compare them as separate tables"
    )


def merged_provenance(provenances: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's provenance over its seeds: each field's value, or the list of the values where
    seeds differ (a code version per chunk of a study, say). A field that is already such a
    list (rows merged again, as a budget axis merges its budgets) gives its values, once each."""
    merged: dict[str, Any] = {}
    for key in PROVENANCE_FIELDS:
        given = [p.get(key) for p in provenances]
        flat = [v for value in given for v in (value if isinstance(value, list) else [value])]
        values = list(dict.fromkeys(json.dumps(v) for v in flat))
        decoded = [json.loads(v) for v in values]
        merged[key] = decoded[0] if len(decoded) == 1 else decoded
    return merged


def provenance_table(rows: list[dict]) -> str:
    """comparison.md's provenance: per row, what its numbers rest on."""
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        if isinstance(r.get("provenance"), dict):
            seen.setdefault(r["scheme"], {**r["provenance"], "eval": r.get("precision")})
    if not seen:
        return ""
    header = (
        "\n\n### provenance\n\n| row | vocabulary | corpus | model | steps | training tokens | "
        "training precision | evaluation precision | code | trained on |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for name, p in seen.items():
        cells = [
            p.get("vocabulary"),
            p.get("corpus"),
            p.get("model"),
            p.get("steps"),
            p.get("train_tokens"),
            p.get("train_precision"),
            p.get("eval"),
            p.get("code"),
            p.get("machine"),
        ]
        lines.append(f"| {name} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def caption(rows: list[dict]) -> str:
    """One line for a figure: the vocabulary, precision, code, corpus, model, steps, tokens and
    training machine of its rows (each field once where the rows agree)."""
    provs = [r["provenance"] for r in rows if isinstance(r.get("provenance"), dict)]
    if not provs:
        return ""
    merged = merged_provenance(provs)
    precisions = sorted({str(r.get("precision")) for r in rows if r.get("precision")})
    parts = [
        f"{_cell(merged['corpus'])}, vocabulary {_cell(merged['vocabulary'])}",
        f"{_cell(merged['model'])}, {_cell(merged['steps'])} steps "
        f"({_cell(merged['train_tokens'])} tokens)",
        f"train {_cell(merged['train_precision'])}, eval {', '.join(precisions) or '—'}",
        f"code {_code_cell(merged['code'])}",
        f"trained on {_cell(merged['machine'])}",
    ]
    return "; ".join(parts)


CAPTION_COMMITS = 4  # more than this and a caption counts them (a study's chunks: 20 and more)


def _code_cell(value: Any) -> str:
    """A few code versions by name; many counted, since each row's is in the table beside the
    figure (a line of 20 hashes under a plot is read by nobody)."""
    if isinstance(value, list) and len(value) > CAPTION_COMMITS:
        return f"from {len(value)} commits (each row's in the provenance table)"
    return _cell(value)


def _cell(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, int) and value >= 10_000:
        return f"{value / 1e6:.1f}M" if value >= 1_000_000 else f"{value:,}"
    return str(value)
