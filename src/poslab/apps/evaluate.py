"""Perplexity beyond the training length: `python eval.py run=RUN` or `poslab-eval run=RUN` (the
config: poslab/conf/eval.yaml)."""

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from poslab.errors import ConfigError, require_extra
from poslab.run.cli import hydra_task, run_app

# eval.py's own top-level options: paths (or null), and a switch
PATH_KEYS = ("ckpt", "run", "hf", "out_dir", "data_path")
ENTRY_KEYS = (*PATH_KEYS, "wandb", "hf_context", "hf_trust_remote_code")


def shown(value: Any) -> str:
    """A value as it is typed on the command line: true, null, [a, b]."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value).replace("'", "")


def entry_option_problem(key: str, value: Any) -> str | None:
    """Why `key=value` is not a value of that top-level option (None: it is)."""
    if key == "hf_trust_remote_code":
        if isinstance(value, bool):
            return None
        return f"hf_trust_remote_code={shown(value)} must be true or false"
    if key == "wandb":
        if isinstance(value, bool):
            return None
        return (
            f"wandb={shown(value)} must be true or false (true: log a job_type=eval W&B run "
            "when the training run used W&B)"
        )
    if key == "hf_context":
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return None
        return (
            f"hf_context={shown(value)} must be a positive number of tokens (the context the "
            "model was trained at), or null for its config's max_position_embeddings"
        )
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        # Hydra reads `out_dir=7` as a number: the path spelled so that it stays text
        return (
            f"{key}={value} is a number, not a path; for a path named {value} write {key}=./{value}"
        )
    return f"{key}={shown(value)} is not a path; pass one path: {key}=PATH"


def check_command_line(args: list[str]) -> None:
    """The top-level options as typed, checked before Hydra starts: a wrong type of ckpt, run or
    out_dir would otherwise fail inside Hydra's run-folder interpolation with a TypeError that
    names none of them. Each value of a -m sweep (`run=A,B`) is checked."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    parser = OverridesParser.create()
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg or key not in ENTRY_KEYS:
            continue
        try:
            override = parser.parse_override(arg)
        except Exception:  # bad syntax: Hydra reports it in its own words
            continue
        value = override.value()
        if isinstance(value, ChoiceSweep):
            values = list(value.list)
        elif isinstance(value, RangeSweep):
            values = [value.start]  # numbers, never a path
        elif override.is_sweep_override():
            continue  # glob(): it selects config group options, Hydra says so
        else:
            values = [value]
        for v in values:
            problem = entry_option_problem(key, v)
            if problem:
                raise ConfigError(problem)


@hydra.main(version_base="1.3", config_path="pkg://poslab.conf", config_name="eval")
@hydra_task(owns_folder=False)
def main(cfg: DictConfig) -> None:
    for key in ENTRY_KEYS:  # also when set elsewhere than on the command line
        problem = entry_option_problem(key, cfg.get(key))
        if problem:
            raise ConfigError(problem)
    if cfg.get("hf"):  # a pretrained HF model: transformers, from the hf extra
        require_extra("transformers", "hf", f"eval.py hf={cfg.hf}")
    from poslab.evaluation.run import run_eval  # after Hydra: a typo fails without importing torch
    from poslab.run.threads import choose_threads

    device = str(cfg.eval.get("device", "auto"))
    choose_threads("cuda" if device.startswith("cuda") else "cpu" if device == "cpu" else "auto")
    run_eval(cfg)


def checked_main() -> None:
    check_command_line(sys.argv[1:])
    main()


def entry() -> None:
    run_app(checked_main)


if __name__ == "__main__":
    entry()
