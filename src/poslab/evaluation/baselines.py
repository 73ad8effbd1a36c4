"""What a task's trivial heuristics score, without a model: chance and every stated shortcut
(`Task.shortcuts`) at each evaluation length, on the examples an evaluation would draw; for a
corpus, the perplexity of count models that read no positions (unigram, bigram).

python scripts/baselines.py data=grid --lengths 64 256 1024
python scripts/baselines.py data=wikitext2          # the token cache a run of it would use

Arguments other than the flags are Hydra overrides of conf/train.yaml (data=..., data.task.*=...).
A row a model does not beat is a row that says nothing about positions. Bad input ends with one
`error: ...` line and exit code 2.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf import DictConfig

from poslab.arguments import OneLineParser
from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked
from poslab.tasks import evaluation_batches
from poslab.tasks.base import Task, predictor_accuracy

CONF = Path(__file__).resolve().parents[1] / "conf"


def baseline_rows(task: Task, lengths: list[int], examples: int, seed: int) -> list[dict]:
    """One row per (length, predictor): exact-match and token accuracy over `examples` per
    condition of the task, the examples an evaluation with this seed would score."""
    rows = []
    for length in lengths:
        task.check_length(length, "--lengths")
        batch = [e for _, made in evaluation_batches(task, length, examples, seed) for e in made]
        chance = [task.chance(e) for e in batch]
        rows.append(
            {
                "length": length,
                "predictor": "chance",
                "accuracy": sum(c[0] for c in chance) / len(chance),
                "token_accuracy": sum(c[1] for c in chance) / len(chance),
            }
        )
        for name, predict in task.shortcuts().items():
            exact, token = predictor_accuracy(batch, predict)
            rows.append(
                {"length": length, "predictor": name, "accuracy": exact, "token_accuracy": token}
            )
    return rows


def markdown(rows: list[dict], title: str) -> str:
    lines = [
        f"## {title}: chance and every stated shortcut",
        "",
        "| length | predictor | accuracy | token accuracy |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['length']} | {r['predictor']} | {r['accuracy']:.3f} | {r['token_accuracy']:.3f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def count_model_rows(train: np.ndarray, evaluated: np.ndarray, vocab: int) -> list[dict]:
    """Token perplexity on `evaluated` of two models counted on `train`, neither of which reads
    a position or more than one token of context: a row of a language-model table at or above
    the unigram has not learned to use its context, and one above the bigram uses less of it
    than the previous token alone gives.

    unigram: add-one counts. bigram: P(b | a) = λ·c(a, b)/c(a) + (1 − λ)·P_unigram(b), with λ
    chosen on the last tenth of `train` (counted on the rest), then counted on all of it; the
    evaluated split is never used to fit either."""
    train, evaluated = np.asarray(train, np.int64), np.asarray(evaluated, np.int64)
    if len(train) < 20 or len(evaluated) < 2:
        raise ValueError(
            f"count models need ≥ 20 training and ≥ 2 evaluated tokens "
            f"(got {len(train)} and {len(evaluated)})"
        )
    held = len(train) - len(train) // 10
    fitted = _Bigram(train[:held], vocab)
    lambdas = [i / 20 for i in range(1, 20)]
    best = min(lambdas, key=lambda lam: fitted.nll(train[held - 1 :], lam))
    model = _Bigram(train, vocab)
    targets = evaluated[1:]  # as the models score: every token after the first
    return [
        {"predictor": "unigram (add-one)", "ppl": math.exp(model.unigram_nll(targets))},
        {"predictor": f"bigram (λ = {best:.2f})", "ppl": math.exp(model.nll(evaluated, best))},
    ]


class _Bigram:
    """Unigram and bigram counts of a token stream, kept sparse (vocab² would not fit)."""

    def __init__(self, ids: np.ndarray, vocab: int) -> None:
        self.vocab = vocab
        counts = np.bincount(ids, minlength=vocab)[:vocab] + 1.0
        self.unigram = counts / counts.sum()
        self.pairs, self.pair_counts = np.unique(ids[:-1] * vocab + ids[1:], return_counts=True)
        self.first = np.bincount(ids[:-1], minlength=vocab)[:vocab]

    def unigram_nll(self, ids: np.ndarray) -> float:
        return float(-np.log(self.unigram[ids]).mean())

    def nll(self, ids: np.ndarray, lam: float) -> float:
        """Mean NLL of ids[1:] given each previous token."""
        prev, nxt = ids[:-1], ids[1:]
        codes = prev * self.vocab + nxt
        at = np.minimum(np.searchsorted(self.pairs, codes), len(self.pairs) - 1)
        pair = np.where(self.pairs[at] == codes, self.pair_counts[at], 0)
        conditional = pair / np.maximum(self.first[prev], 1)
        return float(-np.log(lam * conditional + (1 - lam) * self.unigram[nxt]).mean())


def count_markdown(rows: list[dict], title: str, split: str, scored: str) -> str:
    lines = [
        f"## {title}: count models without positions ({split} split, {scored})",
        "",
        "| predictor | token perplexity |",
        "|---|---|",
    ]
    lines += [f"| {r['predictor']} | {r['ppl']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def corpus_baselines(cfg: DictConfig, split: str, max_tokens: int | None = None) -> str:
    """The count models' table for the corpus of `cfg.data`, from the token cache a run with
    these settings would use (built if need be). `max_tokens`: only the tokens an evaluation
    with eval.max_tokens=N scores (the first whole lines within N tokens), so that a model's
    row and the count models' are perplexities of the same text."""
    from poslab.data.tokens import EOS

    data = instantiate_checked(cfg.data)
    meta = data.meta()
    if split not in meta["splits"]:
        raise ValueError(f"--split {split}: the corpus has {', '.join(meta['splits'])}")
    if split == "train":
        raise ValueError(
            "--split train: the count models are fitted on it; score validation or test"
        )
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"--max-tokens {max_tokens}: give at least 2 (or leave it out)")
    whole = data.cache.split(split)
    scored = f"{len(whole.ids):,} tokens"
    if max_tokens is not None and max_tokens < len(whole.ids):
        whole = whole.head(max_tokens)
        scored = f"the first {len(whole.ids):,} tokens, as eval.max_tokens={max_tokens} scores"
    # preceded by a line end, as the evaluation scores it: every token of the text is a target
    evaluated = whole.after_line_end(data.cache.tokenizer().token_to_id(EOS)).ids
    rows = count_model_rows(data.cache.split("train").ids, evaluated, int(meta["vocab_size"]))
    version = cfg.data.get("tokenizer_version")
    if version is not None:
        scored += f"; vocabulary version {version}"
    return count_markdown(rows, str(cfg.data.name), split, scored)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/baselines.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help="evaluation lengths (default: data.seq_len × eval.factors)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=None,
        help="examples per length and condition (default: eval.task_examples)",
    )
    parser.add_argument("--seed", type=int, default=None, help="default: the config's seed")
    parser.add_argument(
        "--split", default="validation", help="a corpus's split to score (default: validation)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="score the tokens eval.max_tokens=N scores (the first whole lines within N; "
        "default: the whole split)",
    )
    try:
        args, overrides = parser.parse_known_args(argv)
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        if "task" not in cfg.data:
            print(corpus_baselines(cfg, args.split, args.max_tokens), end="")
            return
        task: Task = instantiate(cfg.data.task)
        lengths = args.lengths or [int(cfg.data.seq_len * f) for f in cfg.eval.factors]
        examples = args.examples or int(cfg.eval.task_examples)
        seed = int(cfg.seed if args.seed is None else args.seed)
        rows = baseline_rows(task, lengths, examples, seed)
    except (HydraException, ConfigError, ValueError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    print(markdown(rows, str(cfg.data.name)), end="")
