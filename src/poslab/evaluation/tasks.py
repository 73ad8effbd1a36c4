"""Answer accuracy of a checkpoint trained on a generated task, at 1–16× its training length.

For every evaluation length and every condition of the task (passkey: the key's depth),
`eval.task_examples` fresh examples (seeded by the run's seed, never training or validation
ones) are scored in one forward pass each: the exact match of the answer (the argmax at every
answer position right), the per-token accuracy, and the answer tokens' perplexity. Beside them,
on the same examples: chance and the best of the task's stated shortcuts
(poslab.tasks.base.best_shortcut), the baselines a reader needs.

A run **learned the task at L** when its accuracy at the training length reaches
`eval.learned_at` (0.9); its **effective length** (RULER) is the longest evaluated length up to
which accuracy stays ≥ that threshold at every length (0: it did not learn at L). Every row
carries both, and the steps the run took to reach the threshold on validation data
(`steps_to_learn`, None if it never did). The rows go through the perplexity evaluation's
reports (JSON/CSV/Markdown/PNG, W&B); the plots show accuracy
against length, and a condition × length heatmap.

The options of a corpus evaluation (eval.modes, .stride, .split, .position_offset, .max_tokens,
.bucket_size) do not apply: there are no windows over a split, every example is scored whole
from position 0 (see plan.corpus_options_set).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from poslab.evaluation.plan import EvalPlan, corpus_options_set
from poslab.model.precision import AUTOCAST_DTYPE
from poslab.tasks import evaluation_batches
from poslab.tasks.base import Example, best_shortcut, score

log = logging.getLogger(__name__)


@torch.inference_mode()
def score_examples(
    model: Any, examples: list[Example], batch_size: int, autocast_dtype: torch.dtype | None
) -> dict[str, float]:
    """Exact-match and token accuracy, and the answer tokens' mean NLL, of `examples` (all of
    one length)."""
    device = next(model.parameters()).device
    exact = right = total = 0
    nll = 0.0
    for i in range(0, len(examples), batch_size):
        batch = examples[i : i + batch_size]
        tokens = torch.from_numpy(np.stack([e.tokens for e in batch])).to(device)
        answer = torch.from_numpy(np.stack([e.answer for e in batch])).to(device)
        positions = None  # the token index, unless the scheme reads the task's position axes
        if model.pos.position_axes and batch[0].positions is not None:
            positions = torch.from_numpy(np.stack([e.positions[:-1] for e in batch])).to(device)
        with torch.autocast(
            device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
        ):
            hidden = model.hidden_states(tokens[:, :-1], positions)
        # logits only at the answer positions
        logits = hidden[answer].float() @ model.lm_head.weight.float().T
        targets = tokens[:, 1:][answer]
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        predicted = torch.full(answer.shape, -1, dtype=torch.long, device=device)
        predicted[answer] = logits.argmax(-1)
        for example, row in zip(batch, predicted.cpu().numpy(), strict=True):
            ok, n_right, n = score(example, row)
            exact += ok
            right += n_right
            total += n
    return {
        "accuracy": exact / len(examples),
        "token_accuracy": right / max(total, 1),
        "loss": nll / max(total, 1),
        "tokens": total,
    }


def evaluate_task_plan(
    plan: EvalPlan, score: Callable[[EvalPlan, dict, Any], dict] | None = None
) -> tuple[list[dict], str]:
    """The rows of a checkpoint trained on a generated task, and their title. `score(plan, row,
    bar)` scores one length (default: score_length; a pretrained model reads the task rendered
    in its own tokens, pretrained_tasks.py)."""
    unused = corpus_options_set(plan.eval_cfg)
    if unused:  # eval.py refused them; after training the run's eval block is shared with corpora
        log.info("not used by a task's evaluation: %s", ", ".join(unused))
    task, unsupported = plan.task, plan.unsupported  # settled by the plan
    scheme, variant = plan.scheme_name, plan.variant
    base_row = {
        "scheme": scheme,
        "train_length": plan.train_length,
        "mode": task.name,
        "split": "generated",
        "task": task.name,
        "status": "ok",
        "word_level": False,
        "position_offset": 0,
        "vocab_size": task.vocab_size,
        "variant": variant,
    }
    for model in plan.models.values():
        model.to(plan.device)
    conditions = task.conditions()
    rows = []
    bar = tqdm(total=len(plan.lengths) * len(conditions), desc=task.name, unit="cond", leave=False)
    for length in plan.lengths:
        row = {**base_row, "length": length, "factor": length / plan.train_length}
        if length in unsupported:
            rows.append({**row, "status": f"skipped: {unsupported[length]}"})
            bar.update(len(conditions))
            continue
        rows.append((score or score_length)(plan, row, bar))
    bar.close()
    threshold = float(plan.eval_cfg.get("learned_at", 0.9))
    summary = learning_summary(rows, plan.train_length, threshold)
    learning = plan.learning or {}
    steps = learning.get("steps_to_learn") if learning.get("target") == threshold else None
    for row in rows:
        row.update(summary, steps_to_learn=steps, trained_steps=learning.get("trained_steps"))
    log.info(
        "%s %s: %s",
        scheme,
        task.name,
        f"learned at L, effective length {summary['effective_length']}"
        if summary["learned"]
        else "did not learn at L"
        if summary["learned"] is False
        else "learned at L unknown (the training length was not evaluated)",
    )
    return rows, f"{scheme} on {task.name}: accuracy vs evaluation length"


def learning_summary(rows: list[dict], train_length: int, threshold: float) -> dict[str, Any]:
    """{"learned_at", "learned", "effective_length"} of one run's rows (one per length):
    learned = accuracy at the training length ≥ threshold (None when that length was not
    evaluated); effective length = the longest length from L on up to which every evaluated
    length scores ≥ threshold (0 when the run did not learn at L)."""
    by_length = {r["length"]: r for r in rows if r["length"] >= train_length}
    at_l = by_length.get(train_length)
    passed = None
    if at_l is not None:
        passed = at_l["status"] == "ok" and at_l.get("accuracy", 0.0) >= threshold
    effective = 0
    if passed:
        for length in sorted(by_length):
            row = by_length[length]
            if row["status"] != "ok" or row.get("accuracy", 0.0) < threshold:
                break
            effective = length
    return {"learned_at": threshold, "learned": passed, "effective_length": effective}


def score_length(plan: EvalPlan, row: dict, bar: Any) -> dict:
    """`row` (one length) with the accuracy of eval.task_examples fresh examples under each of
    the task's conditions, and (several conditions) `by_condition`: the accuracy under each."""
    examples, seed = int(plan.eval_cfg.task_examples), int(plan.model_config["seed"])
    batches = evaluation_batches(plan.task, row["length"], examples, seed)
    return scored_row(plan, row, [(c, b, b) for c, b in batches], bar)


# one condition's examples: (condition, the task's examples, the examples the model reads: the
# same ones for a poslab checkpoint, their rendering in its own tokens for a pretrained model)
ConditionExamples = tuple[dict | None, list[Example], list[Example]]


def scored_row(plan: EvalPlan, row: dict, batches: list[ConditionExamples], bar: Any) -> dict:
    """`row` with the model's scores on `batches` (examples of row["length"] tokens) and the
    baselines (chance, the best shortcut) on the task's examples."""
    task, length = plan.task, row["length"]
    started = time.perf_counter()
    examples = len(batches[0][1])
    batch_size = plan.eval_cfg.batch_size or max(1, 8192 // length)
    by_condition, sums = [], {"accuracy": 0.0, "token_accuracy": 0.0, "loss": 0.0}
    tokens = 0
    chances, every_example = [], []
    for condition, batch, read in batches:
        chances += [task.chance(e) for e in batch]
        every_example += batch
        dtype = AUTOCAST_DTYPE[plan.precision]
        result = score_examples(plan.models[length], read, batch_size, dtype)
        scores = {k: result[k] for k in sums}
        by_condition.append({"condition": condition, "examples": examples, **scores})
        for k in sums:
            sums[k] += result[k] * (result["tokens"] if k == "loss" else 1)
        tokens += result["tokens"]
        bar.update(1)
    seconds = time.perf_counter() - started
    scored = examples * len(batches)
    shortcut = best_shortcut(task, every_example)  # the same examples the model answered
    loss = sums["loss"] / max(tokens, 1)
    row = {
        **row,
        "accuracy": sums["accuracy"] / len(batches),
        "token_accuracy": sums["token_accuracy"] / len(batches),
        "loss": loss,
        "ppl": math.exp(loss) if math.isfinite(loss) else math.nan,
        "chance": sum(c[0] for c in chances) / len(chances),
        "token_chance": sum(c[1] for c in chances) / len(chances),
        "shortcut": shortcut["accuracy"] if shortcut else None,
        "shortcut_token": shortcut["token_accuracy"] if shortcut else None,
        "shortcut_name": shortcut["name"] if shortcut else None,
        "examples": scored,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": scored * length / seconds,
        "by_condition": by_condition if len(batches) > 1 else None,
    }
    if not math.isfinite(loss):
        row["status"] = "nonfinite"
    log.info(
        "%s %s L=%d: accuracy %.3f, token accuracy %.3f, answer ppl %.2f",
        row["scheme"],
        task.name,
        length,
        row["accuracy"],
        row["token_accuracy"],
        row["ppl"],
    )
    return row
