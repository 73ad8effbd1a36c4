"""What a task's trivial heuristics score, without a model: chance and every stated shortcut
(`Task.shortcuts`) at each evaluation length, on the examples an evaluation would draw.

python scripts/baselines.py data=grid --lengths 64 256 1024

Arguments other than the flags are Hydra overrides of conf/train.yaml (data=..., data.task.*=...).
A row a model does not beat is a row that says nothing about positions. Bad input ends with one
`error: ...` line and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate

from poslab.arguments import OneLineParser
from poslab.errors import ConfigError
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
    try:
        args, overrides = parser.parse_known_args(argv)
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        if "task" not in cfg.data:
            raise ValueError(
                f"data={cfg.data.name} is a corpus, not a task: pick a task "
                "(data=needle, multi_key, copy, grid, ...)"
            )
        task: Task = instantiate(cfg.data.task)
        lengths = args.lengths or [int(cfg.data.seq_len * f) for f in cfg.eval.factors]
        examples = args.examples or int(cfg.eval.task_examples)
        seed = int(cfg.seed if args.seed is None else args.seed)
        rows = baseline_rows(task, lengths, examples, seed)
    except (HydraException, ConfigError, ValueError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    print(markdown(rows, str(cfg.data.name)), end="")
