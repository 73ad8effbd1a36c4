"""Text from a poslab run, directly from its checkpoint: `python scripts/generate.py run=RUN
prompt="..."` (or `poslab-generate`).

The model is poslab's own (no export needed), with the tokenizer the run recorded. Each new token
recomputes the whole sequence (no key/value cache: right for every scheme, quadratic in the
length). A run on a generated task has no text tokenizer; its prompt is token ids
(`prompt="3 17 5"`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError, exit_on_config_error

USAGE = """usage: python scripts/generate.py run=RUN prompt="TEXT" [key=value ...]

  run=DIR | ckpt=FILE     the training run (its best checkpoint) or a checkpoint file
  prompt=TEXT             the text to continue (a task run: token ids, space-separated)
  max_new_tokens=50       how many tokens to add
  temperature=0           0: greedy (the most likely token); above 0: sampling
  top_k=null              sample among the k most likely tokens only
  seed=0                  the sampling seed
  device=cpu              cpu, cuda, cuda:1, ...
  data_path=DIR           the corpus, if it moved (a checkpoint older than its tokenizer record)
  eval.rope_scaling.*, eval.pos_overrides.*: as eval.py (e.g. eval.rope_scaling.kind=yarn
                          eval.rope_scaling.factor=4)
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
}


def parse(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """key=value arguments -> (the options, eval-time options as nested dicts)."""
    import yaml

    options, eval_options = dict(DEFAULTS), {}
    for arg in argv:
        key, sep, text = arg.partition("=")
        if not sep:
            raise ConfigError(f'{arg!r}: arguments are key=value (e.g. prompt="The"); see --help')
        value = text if key in ("prompt", "run", "ckpt", "data_path") else yaml.safe_load(text)
        if key.startswith(("eval.rope_scaling.", "eval.pos_overrides.")):
            _, group, option = key.split(".", 2)
            eval_options.setdefault(group, {})[option] = value
        elif key in DEFAULTS:
            options[key] = value
        else:
            known = ", ".join([*DEFAULTS, "eval.rope_scaling.*", "eval.pos_overrides.*"])
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
) -> Any:
    """`ids` (1, T) continued by up to `new_tokens` tokens, stopping after `stop` (<eos>)."""
    import torch

    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(ids)[:, -1].float()
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


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return
    options, eval_options = parse(argv)
    import torch

    from poslab.data.tokens import EOS
    from poslab.evaluation.run import checkpoint_of_run
    from poslab.hf.export import run_tokenizer
    from poslab.model.build import load_checkpoint, read_checkpoint

    ckpt = Path(options["ckpt"]) if options["ckpt"] else checkpoint_of_run(options["run"])
    config = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    overrides = dict(eval_options.get("pos_overrides", {}))
    if "rope_scaling" in eval_options:
        from poslab.positions.rope_scaling import scaling_options

        train_length = int(config["data"]["seq_len"])
        scaling = scaling_options(
            eval_options["rope_scaling"], config["pos"], train_length, train_length
        )
        overrides["scaling"] = scaling
    model, config = load_checkpoint(ckpt, pos_overrides=overrides or None)
    device = torch.device(options["device"])
    model = model.to(device)
    task = "task" in config["data"]
    tokenizer = None if task else run_tokenizer(ckpt, config, options["data_path"])
    if task:
        try:
            prompt = [int(t) for t in options["prompt"].split()]
        except ValueError:
            raise ConfigError(
                f"{ckpt} was trained on a generated task: its prompt is token ids "
                '(prompt="3 17 5"), not text'
            ) from None
        stop = None
    else:
        prompt = tokenizer.encode(options["prompt"]).ids
        stop = tokenizer.token_to_id(EOS)
    vocab = model.config.vocab_size
    if not prompt or max(prompt) >= vocab or min(prompt) < 0:
        raise ConfigError(f"prompt={options['prompt']!r} gives no tokens of the model's {vocab}")
    generator = torch.Generator().manual_seed(options["seed"])
    ids = torch.tensor([prompt], device=device)
    out = generate(
        model,
        ids,
        options["max_new_tokens"],
        float(options["temperature"]),
        options["top_k"],
        stop,
        generator,
    )
    new = out[0, len(prompt) :].tolist()
    text = " ".join(map(str, new)) if task else tokenizer.decode(new)
    print(f"{options['prompt'].rstrip()} {text.strip()}", flush=True)


if __name__ == "__main__":
    main()
