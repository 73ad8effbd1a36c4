"""poslab's generated tasks on a pretrained HF causal LM: `python eval.py hf=MODEL data=needle`.

A task example is a sequence of words over the task's vocabulary. The model reads it as text:
its words joined by spaces (trailing padding dropped), after the tokenizer's start token (BOS,
else EOS), tokenized by the model's own tokenizer. The answer is the model tokens that overlap
the answer's characters (its first to its last, the spaces between its words included: what
greedy decoding must write), and the score stays the exact match of tasks/base.py under teacher
forcing: every answer token is the model's argmax.

Lengths are in the model's tokens: for each example the task length (in words) is searched so
that the tokenized example is as long as possible without exceeding the evaluation length (the
model reads `length` tokens and predicts the last, as for a poslab example of `length` + 1
tokens). Every example keeps its own random draws across the search (its generator is made anew
from (seed, length, index) at each try), so only its size changes. Chance and the best shortcut
are computed on the task's own examples (task words), as the task tables print them for a
poslab checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from poslab.errors import ConfigError
from poslab.evaluation.plan import EvalPlan, corpus_options_set
from poslab.evaluation.tasks import evaluate_task_plan, scored_row
from poslab.tasks import EVALUATION
from poslab.tasks.base import Example, Task, example_rng

# the examples' seed: every pretrained model is asked the same draws at a given length
TASK_SEED = 0


@dataclass(frozen=True)
class Rendered:
    """One task example and what the model reads of it."""

    example: Example  # in task words: chance and the shortcuts read it
    ids: np.ndarray  # the model's tokens: the start token, then the text's (≤ length + 1)
    answer: np.ndarray  # (len(ids) - 1,) bool over the targets ids[1:]
    text: str
    spans: list[tuple[int, int]]  # the answer's characters in `text` (one span per run)

    def padded(self, length: int, pad: int) -> Example:
        """As an Example of exactly `length` + 1 tokens: padding after the answer, which a
        causal model's earlier logits never see."""
        tokens = np.full(length + 1, pad, dtype=np.int64)
        tokens[: len(self.ids)] = self.ids
        answer = np.zeros(length, dtype=bool)
        answer[: len(self.answer)] = self.answer
        return Example(tokens, answer, self.example.condition)


def hf_tasks() -> list[str]:
    """The conf/data/ tasks a pretrained model can be given: those of one position per token
    (not a grid's rows and columns; an image task is a grid)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    import poslab.conf

    names = []
    for path in sorted(Path(poslab.conf.__file__).parent.glob("data/*.yaml")):
        target = OmegaConf.load(path).get("task", {}).get("_target_")
        if target and get_class(target).position_axes == 0:
            names.append(path.stem)
    return names


def task_of_command(cfg: Any) -> Task | None:
    """The task of `eval.py hf=MODEL data=<task>` (None without data=), built and checked
    before the model is loaded: a task of one position per token, no corpus, no corpus-only
    option."""
    from hydra.utils import get_class

    from poslab.instantiate import instantiate_checked

    data = cfg.get("data")
    if data is None:
        return None
    name = data.get("name", "?")
    target = (data.get("task") or {}).get("_target_")
    works = f"with hf= use data={'|'.join(hf_tasks())}"
    if not target:
        raise ConfigError(
            f"data={name} is a corpus, not a generated task: score hf={cfg.hf} on a corpus "
            f"with data_path=DIR (and no data=), or on a task: {works}"
        )
    if get_class(target).position_axes:
        raise ConfigError(
            f"data={name} gives every token {get_class(target).position_axes} positions (a "
            f"grid), which hf={cfg.hf} cannot be given; {works}"
        )
    if cfg.data_path:
        raise ConfigError(
            f"data_path={cfg.data_path}: data={name} is generated, no corpus is read; leave "
            "data_path out"
        )
    unused = corpus_options_set(cfg.eval)
    if unused:
        raise ConfigError(
            f"{', '.join(unused)}: data={name} is scored on fresh examples "
            "(eval.task_examples per length and condition), each in one forward pass from "
            f"position 0, not by windows over a corpus split; leave "
            f"{'this option' if len(unused) == 1 else 'these options'} out"
        )
    return instantiate_checked(data.task)


def render(task: Task, example: Example) -> tuple[str, list[tuple[int, int]]]:
    """The example's words joined by spaces (the padding after it dropped) and the character
    span of each run of consecutive answer words, with the spaces between them: the answer as
    the model must write it."""
    ids = example.tokens.tolist()
    while ids and ids[-1] == 0:  # padding (id 0) only ever follows the answer
        ids.pop()
    words = [task.tokens[i] for i in ids]
    starts = np.cumsum([0, *(len(w) + 1 for w in words)])
    spans: list[tuple[int, int]] = []
    previous = None
    for j in (np.flatnonzero(example.answer) + 1).tolist():  # targets are tokens[1:]
        end = int(starts[j]) + len(words[j])
        if previous == j - 1:  # the run goes on: its span grows over the space
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((int(starts[j]), end))
        previous = j
    return " ".join(words), spans


def tokenize(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], start: int
) -> tuple[np.ndarray, np.ndarray]:
    """(the start token and the text's tokens, the answer over the targets ids[1:]): the tokens
    that cover any answer character (a token that also holds a character before the answer is
    part of it: the model must write it to write the answer)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    inside = np.zeros(len(text) + 1, dtype=np.int64)
    for s, e in spans:
        inside[s:e] = 1
    covered = np.concatenate([[0], np.cumsum(inside)])  # answer characters before index c
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    answer = covered[offsets[:, 1]] - covered[offsets[:, 0]] > 0
    ids = np.asarray([start, *enc["input_ids"]], dtype=np.int64)
    return ids, answer


def too_short(task: Task, length: int, tokens: int, source: str | None) -> ConfigError:
    """The line for an evaluation length shorter than the task's shortest example (`tokens`
    model tokens) in the tokens of hf=`source` (None: "this model")."""
    model = "this model's" if source is None else f"hf={source}'s"
    return ConfigError(
        f"eval length {length} is too short for the {task.name} task in {model} tokens: its "
        f"shortest example takes {tokens}; evaluate longer lengths (eval.lengths=[...] or "
        "eval.factors=[...])"
    )


def fitted(
    task: Task,
    length: int,
    make: Callable[[int], Example],
    tokenizer: Any,
    start: int,
    source: str | None = None,
) -> Rendered:
    """The example `make(n)` of the largest task length n whose tokens fit in `length` + 1
    (one more word does not fit): a search that steps by the example's tokens per word and
    bisects on alternate tries, so a long example takes a handful of tokenizations."""
    budget = length + 1

    def attempt(n: int) -> Rendered:
        example = make(n)
        text, spans = render(task, example)
        ids, answer = tokenize(tokenizer, text, spans, start)
        return Rendered(example, ids, answer, text, spans)

    lo = task.min_length()
    best = attempt(lo)
    if len(best.ids) > budget:
        raise too_short(task, length, len(best.ids) - 1, source)
    hi: int | None = None  # the smallest task length known not to fit
    last_n, last_tokens = lo, len(best.ids)
    for step in range(200):  # bounded: each try narrows (lo, hi) or lengthens lo by 1/8
        if hi is not None and hi - lo <= 1:
            break
        # tokens per task word of the last try, to step straight towards the budget
        estimate = int(budget * (last_n + 1) / last_tokens) - 1
        if hi is None:  # just past the estimate, and at least 1/8 longer: a bound soon
            n = max(estimate + 1 + estimate // 32, lo + 1 + lo // 8)
        else:
            n = estimate if step % 2 == 0 and lo < estimate < hi else (lo + hi) // 2
        tried = attempt(n)
        last_n, last_tokens = n, len(tried.ids)
        if len(tried.ids) <= budget:
            lo, best = n, tried
        else:
            hi = n
    return best


def rendered_batches(plan: EvalPlan, length: int) -> list[tuple[dict | None, list[Rendered]]]:
    """eval.task_examples examples under each of the task's conditions at `length`, fitted in
    the model's tokens; example i of condition c draws from (seed, length, c·count + i), as a
    checkpoint's evaluation examples do (tasks.evaluation_batches)."""
    from poslab.hf.pretrained import start_token

    task, count = plan.task, int(plan.eval_cfg.task_examples)
    start = start_token(plan.tokenizer)

    def maker(index: int, condition: dict) -> Callable[[int], Example]:
        # a fresh generator at every try: the same draws, only the task length changes
        return lambda n: task.example(
            n, example_rng(TASK_SEED, EVALUATION, length, index), condition
        )

    batches = []
    for c, condition in enumerate(task.conditions()):
        made = [maker(c * count + i, condition) for i in range(count)]
        fits = [fitted(task, length, m, plan.tokenizer, start, plan.source) for m in made]
        batches.append((condition, fits))
    return batches


def check_lengths_fit(plan: EvalPlan) -> None:
    """Every evaluation length holds the task's shortest example in the model's tokens: one
    line before any scoring, not after the short lengths were scored."""
    from poslab.hf.pretrained import start_token

    task, start = plan.task, start_token(plan.tokenizer)
    for length in plan.lengths:
        rng = example_rng(TASK_SEED, EVALUATION, length, 0)
        text, spans = render(task, task.example(task.min_length(), rng, task.conditions()[0]))
        ids, _ = tokenize(plan.tokenizer, text, spans, start)
        if len(ids) > length + 1:
            raise too_short(task, length, len(ids) - 1, plan.source)


def score_rendered_length(plan: EvalPlan, row: dict, bar: Any) -> dict:
    """One length's row (tasks.scored_row) of the rendered examples, with what they were: the
    task length in words and the model tokens read per example (≤ the length)."""
    from poslab.hf.pretrained import start_token

    length = row["length"]
    batches = rendered_batches(plan, length)
    pad = start_token(plan.tokenizer)
    scored = [
        (c, [r.example for r in made], [r.padded(length, pad) for r in made]) for c, made in batches
    ]
    every = [r for _, made in batches for r in made]
    read = np.asarray([len(r.ids) - 1 for r in every])
    words = np.asarray([len(r.text.split()) for r in every])
    row = scored_row(plan, row, scored, bar)
    return {
        **row,
        "example_tokens_min": int(read.min()),
        "example_tokens_mean": float(read.mean()),
        "example_tokens_max": int(read.max()),
        "task_words_mean": float(words.mean()),
        "example_seed": TASK_SEED,
    }


def evaluate_pretrained_task(plan: EvalPlan, task: Task, data: Any) -> tuple[list[dict], str]:
    """The rows of a pretrained model on `task` (a checkpoint's task rows: accuracy per length
    and condition, chance, the best shortcut), and their title."""
    from omegaconf import OmegaConf

    plan.task = task
    # the run's config says which task (W&B records it; plan.is_task reads it)
    task_config = OmegaConf.to_container(data.task, resolve=True)
    plan.config["data"] = {**plan.config["data"], "name": data.get("name"), "task": task_config}
    plan.settle()  # the lengths the model cannot represent, now that the task's positions are known
    check_lengths_fit(plan)
    rows, _ = evaluate_task_plan(plan, score_rendered_length)
    vocab_size = plan.models[plan.lengths[0]].vocab_size  # its output rows, as text rows say
    rows = [{**r, "vocab_size": vocab_size, "precision": plan.precision} for r in rows]
    scheme = rows[0]["scheme"]
    return rows, f"{scheme} on {task.name} (rendered in its own tokens): accuracy vs length"
