"""Text from a poslab run, directly from its checkpoint: `python scripts/generate.py run=RUN
prompt="..."` (or `poslab-generate`).

The model is poslab's own (no export needed), with the tokenizer the run recorded. It keeps a
key/value cache where the model allows one (GPT.cache_problem says why not: then each new token
recomputes the whole sequence, right for every scheme and quadratic in the length); `cache=false`
leaves it out. A run on a generated task has no text tokenizer; its prompt is token ids
(`prompt="3 17 5"`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError, exit_on_config_error

log = logging.getLogger(__name__)
USAGE = """usage: python scripts/generate.py run=RUN prompt="TEXT" [key=value ...]

  run=DIR | ckpt=FILE     the training run (its best checkpoint) or a checkpoint file
  prompt=TEXT             the text to continue (a task run: token ids, space-separated)
  max_new_tokens=50       how many tokens to add
  temperature=0           0: greedy (the most likely token); above 0: sampling
  top_k=null              sample among the k most likely tokens only
  seed=0                  the sampling seed
  device=cpu              cpu, cuda, cuda:1, ...
  cache=true              a key/value cache where the model allows one (false: recompute)
  data_path=DIR           the corpus, if it moved (a checkpoint older than its tokenizer record)
  eval.*                  eval.py's options that change the model: eval.rope_scaling.*,
                          eval.logn_scaling, eval.pos_overrides.* (e.g.
                          eval.rope_scaling.kind=yarn eval.rope_scaling.factor=4)
"""
DEFAULTS: dict[str, Any] = {
    "run": None,
    "ckpt": None,
    "prompt": None,
    "max_new_tokens": 50,
    "temperature": 0.0,
    "top_k": None,
    "seed": 0,
    "device": "cpu",
    "data_path": None,
    "cache": True,
}


def parse(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """key=value arguments -> (the options, eval-time options as nested dicts)."""
    import yaml

    from poslab.positions.rope_scaling import EVAL_MODEL_KEYS

    options: dict[str, Any] = dict(DEFAULTS)
    eval_options: dict[str, Any] = {}
    for arg in argv:
        key, sep, text = arg.partition("=")
        if not sep:
            raise ConfigError(f"{arg!r}: arguments are key=value (e.g. prompt=The); see --help")
        value = text if key in ("prompt", "run", "ckpt", "data_path") else yaml.safe_load(text)
        path = key.split(".")
        if path[0] == "eval" and len(path) > 1 and path[1] in EVAL_MODEL_KEYS:
            node = eval_options
            for part in path[1:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        elif key in DEFAULTS:
            options[key] = value
        else:
            model_keys = [f"eval.{k}" for k in EVAL_MODEL_KEYS]
            known = ", ".join([*DEFAULTS, *model_keys])
            raise ConfigError(f"{key}=: no such option (options: {known})")
    if (options["run"] is None) == (options["ckpt"] is None):
        raise ConfigError("pass exactly one of run=RUN_DIR or ckpt=PATH")
    if not options["prompt"]:
        raise ConfigError('pass prompt="..." (the text to continue)')
    for key, low in (("max_new_tokens", 1), ("top_k", 1), ("seed", 0)):
        value = options[key]
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < low
        ):
            raise ConfigError(f"{key}={value!r} must be an integer ≥ {low}")
    if not isinstance(options["cache"], bool):
        raise ConfigError(f"cache={options['cache']!r}; choose true or false")
    temperature = options["temperature"]
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or temperature < 0
    ):
        raise ConfigError(f"temperature={temperature!r} must be a number ≥ 0 (0: greedy)")
    return options, eval_options


def generate(
    model: Any,
    ids: Any,
    new_tokens: int,
    temperature: float,
    top_k: int | None,
    stop: int | None,
    generator: Any,
    cache: Any = None,
) -> Any:
    """`ids` (1, T) continued by up to `new_tokens` tokens, stopping after `stop` (<eos>); with
    a `cache` (model.new_cache()), each step feeds the tokens the cache has not seen."""
    import torch

    with torch.inference_mode():
        for _ in range(new_tokens):
            fresh = ids if cache is None else ids[:, cache.length :]
            logits = model(fresh, cache=cache)[:, -1].float()
            if temperature == 0:
                token = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                token = torch.multinomial(probs.cpu(), 1, generator=generator).to(ids.device)
            ids = torch.cat([ids, token], dim=1)
            if stop is not None and int(token) == stop:
                break
    return ids


def prompt_ids(text: str, tokenizer: Any, vocab: int, ckpt: Path) -> tuple[list[int], int | None]:
    """The prompt's token ids, and the token that ends a generation (<eos>; None for a task
    run, whose prompt is ids)."""
    from poslab.data.tokens import EOS

    if tokenizer is None:
        try:
            ids = [int(t) for t in text.split()]
        except ValueError:
            raise ConfigError(
                f"{ckpt} was trained on a generated task: its prompt is token ids "
                '(prompt="3 17 5"), not text'
            ) from None
        stop = None
    else:
        ids, stop = tokenizer.encode(text).ids, tokenizer.token_to_id(EOS)
    if not ids or max(ids) >= vocab or min(ids) < 0:
        raise ConfigError(f"prompt={text!r} gives no tokens of the model's {vocab}")
    return ids, stop


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return
    options, eval_options = parse(argv)
    import torch

    from poslab.hf.export import run_tokenizer
    from poslab.model.build import load_checkpoint, read_checkpoint
    from poslab.positions.rope_scaling import eval_overrides
    from poslab.run.run_folder import checkpoint_of_run

    ckpt = Path(options["ckpt"]) if options["ckpt"] else checkpoint_of_run(options["run"])
    config = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    train_length = int(config["data"]["seq_len"])
    overrides = eval_overrides(eval_options, config["pos"], train_length, train_length)
    model, config = load_checkpoint(ckpt, pos_overrides=overrides or None)
    device = torch.device(options["device"])
    model = model.to(device)
    task = "task" in config["data"]
    tokenizer = None if task else run_tokenizer(ckpt, config, options["data_path"])
    prompt, stop = prompt_ids(options["prompt"], tokenizer, model.config.vocab_size, ckpt)
    generator = torch.Generator().manual_seed(options["seed"])
    ids = torch.tensor([prompt], device=device)
    problem = model.cache_problem() if options["cache"] else None
    if problem:
        log.info("no key/value cache: %s; each token recomputes the sequence", problem)
    cache = model.new_cache() if options["cache"] and problem is None else None
    out = generate(
        model,
        ids,
        options["max_new_tokens"],
        float(options["temperature"]),
        options["top_k"],
        stop,
        generator,
        cache,
    )
    new = out[0, len(prompt) :].tolist()
    text = " ".join(map(str, new)) if task else tokenizer.decode(new)
    print(f"{options['prompt'].rstrip()} {text.strip()}", flush=True)


if __name__ == "__main__":
    main()
