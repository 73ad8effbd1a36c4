"""Text from a poslab run, directly from its checkpoint: `python scripts/generate.py run=RUN
prompt="..."` (or `poslab-generate`).

The model is poslab's own (no export needed), with the tokenizer the run recorded. It keeps a
key/value cache where the model allows one (GPT.cache_problem says why not: then each new token
recomputes the whole sequence, right for every scheme and quadratic in the length); `cache=false`
leaves it out. A run on a generated task has no text tokenizer; its prompt is token ids
(`prompt="3 17 5"`).

stdout holds the text alone, <unk> shown as <unk>; stderr's `note:` lines say which prompt words
became <unk>, why no cache, and why the generation stopped (<eos> or max_new_tokens); a long
generation says how far it is every 5 s (`note: 120/500 new tokens, 34.1 tokens/s`). A run with
a version-1 word vocabulary (its <eos> is also a word) is refused.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from poslab.errors import ConfigError, exit_on_config_error

USAGE = """usage: python scripts/generate.py run=RUN prompt="TEXT" [key=value ...]

  run=DIR | ckpt=FILE     the training run (its best checkpoint) or a checkpoint file
  prompt=TEXT             the text to continue (a task run: token ids, space-separated)
  max_new_tokens=50       how many tokens to add
  temperature=0           0: greedy (the most likely token); above 0: sampling
  top_k=null              sample among the k most likely tokens only (temperature > 0)
  seed=0                  the sampling seed
  device=cpu              cpu, cuda, cuda:1, ...
  cache=true              a key/value cache where the model allows one (false: recompute)
  data_path=DIR           the corpus, if it moved (a checkpoint older than its tokenizer record)
  eval.*                  eval.py's options that change the model: eval.rope_scaling.*,
                          eval.logn_scaling, eval.pos_overrides.* (e.g.
                          eval.rope_scaling.kind=yarn eval.rope_scaling.factor=4; a kind
                          that reads a factor needs a number: auto has no length to follow;
                          a leading + as eval.py's +eval.pos_overrides.* is taken too)
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
        # eval.py's form of a key its config lacks (+eval.pos_overrides.x=...) means the same
        key = key.removeprefix("+") if key.startswith("+eval.") else key
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
    check_sampling(options["temperature"], options["top_k"])
    from poslab.positions.rope_scaling import check_generation_factor

    check_generation_factor(eval_options)
    return options, eval_options


def check_sampling(temperature: Any, top_k: int | None) -> None:
    """A temperature that is a finite number ≥ 0 (NaN or ∞ would reach torch.multinomial), and
    no top_k that greedy decoding would ignore."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ConfigError(f"temperature={temperature!r} must be a finite number ≥ 0 (0: greedy)")
    if top_k is not None and temperature == 0:
        raise ConfigError(
            f"top_k={top_k} does nothing at temperature=0 (greedy decoding takes the most likely "
            "token); leave top_k out, or sample with a temperature > 0"
        )


def checked_device(name: Any) -> Any:
    """`device=` as a torch.device that exists here (eval.py's check of eval.device)."""
    import torch

    try:
        device = torch.device(str(name))
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a device; choose cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA device is visible; use device=cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(f"device={name}: this machine has {count} CUDA devices (cuda:0 ..)")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name}: generate.py runs on cpu or cuda")
    return device


def generate(
    model: Any,
    ids: Any,
    new_tokens: int,
    temperature: float,
    top_k: int | None,
    stop: int | None,
    generator: Any,
    cache: Any = None,
    progress: Callable[[int], None] | None = None,
) -> Any:
    """`ids` (1, T) continued by up to `new_tokens` tokens, stopping after `stop` (<eos>); with
    a `cache` (model.new_cache()), each step feeds the tokens the cache has not seen.
    `progress` is called with the number of new tokens after each."""
    import torch

    with torch.inference_mode():
        for step in range(new_tokens):
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
            if progress is not None:
                progress(step + 1)
            if stop is not None and int(token) == stop:
                break
    return ids


class Progress:
    """A `note:` line every `every` seconds of a generation: new tokens so far of the most
    asked, and the rate (a short generation says nothing)."""

    def __init__(self, total: int, every: float = 5.0) -> None:
        self.total, self.every = total, every
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every and done < self.total:
            self.last = now
            rate = done / max(now - self.start, 1e-9)
            note(f"{done}/{self.total} new tokens, {rate:.1f} tokens/s")


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


def unknown_words(text: str, tokenizer: Any) -> list[str]:
    """The words of `text` the run's vocabulary lacks (each became <unk>)."""
    from poslab.data.tokens import UNK

    unk = tokenizer.token_to_id(UNK)
    encoding = tokenizer.encode(text)
    return [text[a:b] for i, (a, b) in zip(encoding.ids, encoding.offsets, strict=True) if i == unk]


def decoded(tokenizer: Any, ids: list[int], stop: int | None) -> str:
    """The text of generated `ids`: <unk> shown as <unk> (as HF's tokenizer of the export shows
    it; a plain decode drops special tokens), the <eos> that ended it left out."""
    if ids and stop is not None and ids[-1] == stop:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


def note(line: str) -> None:
    """A line beside the text (stdout holds the text alone)."""
    print(f"note: {line}", file=sys.stderr, flush=True)


def check_room(model: Any, prompt: int, new_tokens: int) -> None:
    """Every position the generation feeds (the last new token is not fed: prompt + new - 2)
    within what the scheme represents (a learned table's rows), checked before generating."""
    try:
        model.pos.check_length(prompt + new_tokens - 2)
    except ConfigError as err:
        # generate takes eval.py's +eval.pos_overrides.x=... without the +
        advice = str(err).replace("+eval.pos_overrides", "eval.pos_overrides")
        raise ConfigError(
            f"the prompt's {prompt} tokens and max_new_tokens={new_tokens}: {advice}; or ask "
            "for fewer new tokens"
        ) from None


def load(
    options: dict[str, Any], eval_options: dict[str, Any], device: Any
) -> tuple[Any, dict[str, Any], Any, Path]:
    """(model on `device`, its config, its tokenizer (None: a task run), the checkpoint)."""
    from poslab.hf.export import check_exportable_tokenizer, run_tokenizer
    from poslab.model.build import load_checkpoint, read_checkpoint
    from poslab.positions.rope_scaling import eval_overrides
    from poslab.run.run_folder import checkpoint_of_run

    ckpt = Path(options["ckpt"]) if options["ckpt"] else checkpoint_of_run(options["run"])
    config = read_checkpoint(ckpt)["hyper_parameters"]["config"]
    task = "task" in config["data"]
    tokenizer = None if task else run_tokenizer(ckpt, config, options["data_path"])
    if tokenizer is not None:  # a version-1 vocabulary: its <eos> is also a word
        check_exportable_tokenizer(tokenizer, V1_GENERATION)
    train_length = int(config["data"]["seq_len"])
    overrides = eval_overrides(eval_options, config["pos"], train_length, train_length)
    model, config = load_checkpoint(ckpt, pos_overrides=overrides or None)
    return model.to(device), config, tokenizer, ckpt


V1_GENERATION = (
    "a generation would end at the first such word and print it as <eos>; generate from a run "
    "trained with data.tokenizer_version=2 (the default)"
)


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return
    options, eval_options = parse(argv)
    import torch

    device = checked_device(options["device"])
    model, config, tokenizer, ckpt = load(options, eval_options, device)
    prompt, stop = prompt_ids(options["prompt"], tokenizer, model.config.vocab_size, ckpt)
    new_tokens = options["max_new_tokens"]
    check_room(model, len(prompt), new_tokens)
    unknown = unknown_words(options["prompt"], tokenizer) if tokenizer is not None else []
    if unknown:
        words = ", ".join(map(repr, unknown[:8])) + (", ..." if len(unknown) > 8 else "")
        note(f"{len(unknown)} prompt word(s) not in the run's vocabulary became <unk>: {words}")
    problem = model.cache_problem() if options["cache"] else None
    if problem:
        note(f"no key/value cache: {problem}; each token recomputes the sequence")
    cache = model.new_cache() if options["cache"] and problem is None else None
    generator = torch.Generator().manual_seed(options["seed"])
    ids = torch.tensor([prompt], device=device)
    temperature = float(options["temperature"])
    sampling = (temperature, options["top_k"], stop, generator, cache, Progress(new_tokens))
    out = generate(model, ids, new_tokens, *sampling)
    new = out[0, len(prompt) :].tolist()
    text = " ".join(map(str, new)) if tokenizer is None else decoded(tokenizer, new, stop)
    print(f"{options['prompt'].rstrip()} {text.strip()}", flush=True)
    if stop is not None and new and new[-1] == stop:
        note(f"stopped at the end of a text (<eos>) after {len(new)} new tokens")
    else:
        note(f"stopped at max_new_tokens={new_tokens}")


if __name__ == "__main__":
    main()
