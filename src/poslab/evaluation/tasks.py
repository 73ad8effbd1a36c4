"""Answer accuracy of a checkpoint trained on a generated task, at 1–16× its training length.

For every evaluation length and every condition of the task (passkey: the key's depth),
`eval.task_examples` fresh examples (seeded by the run's seed, never training or validation
ones) are scored in one forward pass each: the exact match of the answer (the argmax at every
answer position right), the per-token accuracy, and the answer tokens' perplexity. The rows go
through the perplexity evaluation's reports (JSON/CSV/Markdown/PNG, W&B); the plots show accuracy
against length, and a condition × length heatmap.

The options of a corpus evaluation (eval.modes, .stride, .split, .position_offset, .max_tokens,
.bucket_size) do not apply: there are no windows over a split, every example is scored whole
from position 0. eval.py refuses them for a task checkpoint (`corpus_options_set`); the
evaluation after training, which shares the run's eval block with corpus runs, says it ignores
them.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from poslab.evaluation.run import (
    models_by_length,
    pick_device,
    report_rows,
    row_name,
    unsupported_lengths,
)
from poslab.precision import AUTOCAST_DTYPE, resolve_precision
from poslab.tasks import EVALUATION, TaskExamples, build_task
from poslab.tasks.base import Example, Task, score
from poslab.validate import eval_lengths

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


def evaluate_task(
    model_at: dict[int, Any], task: Task, lengths: list[int], seed: int, examples: int,
    batch_size: int | None, autocast_dtype: torch.dtype | None, base_row: dict,
    unsupported: dict[int, str],
) -> list[dict]:  # fmt: skip
    """One row per length (mode = the task's name), with `by_condition`: the accuracy under
    each of the task's conditions."""
    conditions = task.conditions()
    rows = []
    bar = tqdm(total=len(lengths) * len(conditions), desc=task.name, unit="cond", leave=False)
    for length in lengths:
        row = {**base_row, "length": length, "factor": length / base_row["train_length"]}
        if length in unsupported:
            rows.append({**row, "status": f"skipped: {unsupported[length]}"})
            bar.update(len(conditions))
            continue
        started = time.perf_counter()
        by_condition, sums = [], {"accuracy": 0.0, "token_accuracy": 0.0, "loss": 0.0}
        tokens = 0
        chance = (0.0, 0.0)
        for c, condition in enumerate(conditions):
            made = TaskExamples(task, length, examples, seed, EVALUATION, condition=condition)
            batch = [made.example(c * examples + i) for i in range(examples)]
            chance = task.chance(batch[0])
            result = score_examples(
                model_at[length], batch, batch_size or max(1, 8192 // length), autocast_dtype
            )
            by_condition.append({"condition": condition, "examples": examples,
                                 **{k: result[k] for k in sums}})  # fmt: skip
            for k in sums:
                sums[k] += result[k] * (result["tokens"] if k == "loss" else 1)
            tokens += result["tokens"]
            bar.update(1)
        seconds = time.perf_counter() - started
        scored = examples * len(conditions)
        loss = sums["loss"] / max(tokens, 1)
        row.update(
            accuracy=sums["accuracy"] / len(conditions),
            token_accuracy=sums["token_accuracy"] / len(conditions),
            loss=loss, ppl=math.exp(loss) if math.isfinite(loss) else math.nan,
            chance=chance[0], token_chance=chance[1], examples=scored, tokens=tokens,
            seconds=seconds, tokens_per_s=scored * length / seconds,
            by_condition=by_condition if len(conditions) > 1 else None,
        )  # fmt: skip
        if not math.isfinite(loss):
            row["status"] = "nonfinite"
        rows.append(row)
        log.info(
            "%s %s L=%d: accuracy %.3f, token accuracy %.3f, answer ppl %.2f", row["scheme"],
            task.name, length, row["accuracy"], row["token_accuracy"], row["ppl"],
        )  # fmt: skip
    bar.close()
    return rows


def corpus_options_set(eval_cfg: Any) -> list[str]:
    """The corpus-only eval options (see the module doc) set to something a task's evaluation
    would silently ignore, as `key=value` (eval.py's defaults, and after training's
    max_tokens=auto, are not listed)."""
    modes = list(eval_cfg.modes or [])
    found = [f"eval.modes=[{','.join(map(str, modes))}]"] if modes != ["nonoverlapping"] else []
    for key, unused in (
        ("stride", None), ("bucket_size", None), ("position_offset", 0), ("split", "validation")
    ):  # fmt: skip
        if eval_cfg.get(key, unused) != unused:
            found.append(f"eval.{key}={eval_cfg[key]}")
    if eval_cfg.get("max_tokens") not in (None, "auto"):
        found.append(f"eval.max_tokens={eval_cfg.max_tokens}")
    return found


def task_options_error(ckpt: str | Path, trained: dict, unused: list[str]) -> str:
    name = trained["data"].get("name") or "a task"
    return (
        f"{', '.join(unused)}: {ckpt} was trained on a generated task (data={name}), which is "
        "scored on fresh examples (eval.task_examples per length), each in one forward pass from "
        "position 0, not by windows over a corpus split; leave "
        f"{'this option' if len(unused) == 1 else 'these options'} out"
    )


def evaluate_task_checkpoint(
    ckpt: str | Path, eval_cfg: Any, trained: dict, out_dir: str | Path | None, wandb_run: Any
) -> list[dict]:
    """evaluate_checkpoint for a checkpoint trained on a generated task."""
    unused = corpus_options_set(eval_cfg)
    if unused:  # eval.py refused them; after training the run's eval block is shared with corpora
        log.info("not used by a task's evaluation: %s", ", ".join(unused))
    train_length = int(trained["data"]["seq_len"])
    lengths = eval_lengths(eval_cfg, train_length)
    model_at, config = models_by_length(ckpt, eval_cfg, trained, lengths)
    task = build_task(config["data"])
    for length in lengths:
        task.check_length(length, key="eval length")
    device = pick_device(eval_cfg.device)
    precision = resolve_precision(eval_cfg.precision, device.type, key="eval.precision")
    # a 1-D scheme reads the token index whatever axes the task gives
    reads_axes = next(iter(model_at.values())).pos.position_axes
    largest = task.max_position if reads_axes else (lambda n: n - 1)
    unsupported = unsupported_lengths(model_at, eval_cfg, largest)
    scheme, variant = row_name(config, eval_cfg)
    base_row = {
        "scheme": scheme, "train_length": train_length, "mode": task.name, "split": "generated",
        "task": task.name, "status": "ok", "word_level": False, "position_offset": 0,
        "vocab_size": task.vocab_size, "variant": variant,
    }  # fmt: skip
    for model in model_at.values():
        model.to(device)
    rows = evaluate_task(
        model_at, task, lengths, int(config["seed"]), int(eval_cfg.task_examples),
        eval_cfg.batch_size, AUTOCAST_DTYPE[precision], base_row, unsupported,
    )  # fmt: skip
    title = f"{scheme} on {task.name}: accuracy vs evaluation length"
    return report_rows(rows, title, ckpt, out_dir, eval_cfg, wandb_run)
