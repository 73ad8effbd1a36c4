"""A re-evaluation scores what the run's own evaluation scored, unless told otherwise.

`eval.py run=RUN` once scored the whole split while the run's table (quick start: eval.max_tokens
=auto) scored its first 65,536 tokens: the same model read 4 points apart, and a new user compares
the numbers. So every eval option that decides *what* is scored (split, lengths, modes, stride,
token cap, offset, documents, examples) defaults to the value the run recorded; an option typed on
the command line wins. Eval-time variants (rope_scaling, pos_overrides, logn_scaling), the device,
precision and batch size stay eval.py's own: they are what a re-evaluation is run to change.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from poslab.checks import require, shown
from poslab.run.validate import max_tokens_setting

log = logging.getLogger(__name__)

# what was scored: taken from the run unless given
CORPUS_KEYS = (
    "split",
    "modes",
    "stride",
    "max_tokens",
    "position_offset",
    "bucket_size",
    "short_context",
    "gain_threshold",
    "documents",
    "max_documents",
    "min_document_tokens",
)
# options of a corpus split that per-document scoring (eval.documents) refuses
SPLIT_KEYS = ("split", "modes", "stride", "max_tokens")
LENGTH_KEYS = ("lengths", "factors")
TASK_KEYS = ("task_examples", "learned_at")


AUTO_MIN_TOKENS = 65536


def scored_token_cap(setting: Any, trained_tokens: int | None) -> int | None:
    """eval.max_tokens as a number of tokens (None: the whole split). `auto` caps a short run's
    after-training evaluation at the tokens it trained on (at least AUTO_MIN_TOKENS): scoring
    2M tokens ten times for a model that saw 100k tells nothing more than 100k would."""
    if setting is None:
        return None
    if setting == "auto":
        return None if trained_tokens is None else max(AUTO_MIN_TOKENS, int(trained_tokens))
    require("eval.max_tokens", setting, max_tokens_setting)
    return setting


def given_eval_keys() -> set[str] | None:
    """The eval.KEY options typed on the command line (with +, ++ or ~), from Hydra's record of
    this job; None outside a Hydra job (a caller that passes an eval block means all of it)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "eval":  # a whole eval group option: all of it is given
            return {"*"}
        if key.startswith("eval."):
            keys.add(key.split(".")[1])
    return keys


def run_table(ckpt: Path) -> list[dict[str, Any]] | None:
    """The rows of the run's own evaluation (<run>/extrapolation/extrapolation.json beside the
    checkpoints/ folder), or None when the run has none or it cannot be read."""
    path = ckpt.resolve().parent.parent / "extrapolation" / "extrapolation.json"
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rows if isinstance(rows, list) and rows else None


def recorded_cap(table: list[dict[str, Any]] | None) -> tuple[bool, int | None]:
    """(found, cap): the eval.max_tokens cap the run's table was scored under (None: the whole
    split), read from its rows; found is False when no scored row says."""
    for row in table or []:
        if "max_tokens" in row and row.get("mode") != "documents":
            return True, row["max_tokens"]
    return False, None


def with_recorded_settings(
    eval_cfg: Any,
    config: dict[str, Any],
    ckpt: Path,
    given: set[str],
    trained_tokens: int | None,
) -> tuple[Any, list[str]]:
    """`eval_cfg` with every option that decides what is scored, and was not `given`, taken from
    the run's recorded eval block (`config["eval"]`); and the `key=value` list it took, for the
    line that says so. eval.max_tokens=auto becomes the cap the run's table was scored under (or,
    without a table, the cap `trained_tokens` gives)."""
    recorded = config.get("eval") or {}
    if "*" in given or not recorded:
        return eval_cfg, []
    keys = list(LENGTH_KEYS) + list(TASK_KEYS if "task" in config["data"] else CORPUS_KEYS)
    if "documents" in given and eval_cfg.get("documents"):  # documents asked for: no split
        keys = [k for k in keys if k not in SPLIT_KEYS]
    taken: dict[str, Any] = {}
    for key in keys:
        if key in given or key not in recorded:
            continue
        value = recorded[key]
        if key == "max_tokens" and value == "auto":
            found, cap = recorded_cap(run_table(ckpt))
            value = cap if found else scored_token_cap("auto", trained_tokens)
        if key == "lengths" and "factors" in given:
            continue  # factors typed, lengths not: the typed factors decide (recorded lengths
            # would outrank them: eval_lengths reads lengths first)
        if key == "factors" and "lengths" in given:
            continue
        if value != eval_cfg.get(key):
            taken[key] = value
    if not taken:
        return eval_cfg, []
    merged = OmegaConf.merge(eval_cfg, OmegaConf.create(taken))
    return merged, [f"eval.{k}={shown(v)}" for k, v in taken.items()]


def replaced_settings(eval_cfg: Any, config: dict[str, Any]) -> list[str]:
    """With a whole eval group given (`eval=default`), the run's recorded scoring settings that
    the group replaces, as `key=value` (for the line that says so: silently, a re-evaluation
    scored other tokens than the run's table)."""
    recorded = config.get("eval") or {}
    keys = list(LENGTH_KEYS) + list(TASK_KEYS if "task" in config["data"] else CORPUS_KEYS)
    return [
        f"eval.{k}={shown(recorded[k])}"
        for k in keys
        if k in recorded and recorded[k] != eval_cfg.get(k)
    ]


def comparison_lines(rows: list[dict[str, Any]], table: list[dict[str, Any]] | None) -> list[str]:
    """Each scored row beside the run's own row scored on the same tokens (mode, length, split,
    cap, stride, offset): the run's number, this one, and the relative change. Rows without a
    twin (another cap, another split) are not compared: their numbers answer another question."""
    if not table:
        return []
    same = ("mode", "length", "split", "max_tokens", "stride", "position_offset", "tokens")
    own = {tuple(r.get(k) for k in same): r for r in table if r.get("status") == "ok"}
    lines = []
    for row in rows:
        twin = own.get(tuple(row.get(k) for k in same))
        if row.get("status") != "ok" or twin is None or "ppl" not in twin:
            continue
        change = 100 * (row["ppl"] / twin["ppl"] - 1)
        lines.append(
            f"  {row['mode']} L={row['length']:,}: the run's table {twin['ppl']:.2f}, "
            f"this evaluation {row['ppl']:.2f} ({change:+.1f}%)"
        )
    return lines
