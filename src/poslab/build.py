"""Build a model from a resolved run config (a plain dict), and rebuild it from a checkpoint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from poslab.errors import ConfigError
from poslab.model import GPT, GPTConfig


def instantiate_checked(config: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, but a ConfigError raised by the target arrives as itself (Hydra
    wraps it), and a bad argument becomes a ConfigError naming the target."""
    try:
        return instantiate(config, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, ConfigError):
            raise err.__cause__ from None
        target = config.get("_target_") if hasattr(config, "get") else config
        cause = str(err.__cause__ or err)
        unknown = re.search(r"unexpected keyword argument '(\w+)'", cause)
        if unknown and isinstance(target, str):
            import inspect

            from hydra.utils import get_class

            options = [n for n in inspect.signature(get_class(target)).parameters]
            raise ConfigError(
                f"{target.rsplit('.', 1)[-1]} has no option {unknown.group(1)!r} (it has: "
                f"{', '.join(options)}); check the spelling"
            ) from None
        raise ConfigError(f"cannot build {target}: {cause}") from None


def build_model(config: dict[str, Any], vocab_size: int) -> GPT:
    """GPT with the positional scheme of `config["pos"]` (instantiated from its `_target_`)."""
    model_cfg = {k: v for k, v in config["model"].items() if not k.startswith("_")}
    gpt_config = GPTConfig(vocab_size=vocab_size, **model_cfg)
    pos = instantiate_checked(config["pos"], d_model=gpt_config.d_model, n_head=gpt_config.n_head)
    return GPT(gpt_config, pos)


def scheme_with_overrides(
    pos_cfg: dict[str, Any], overrides: dict[str, Any], d_model: int, n_head: int
) -> Any:
    """The scheme rebuilt with eval-time `overrides`, checked to be options the scheme has and
    to keep its parameters' shapes (so a checkpoint's weights still load)."""
    import inspect

    from hydra.utils import get_class

    target = get_class(pos_cfg["_target_"])
    options = [n for n in inspect.signature(target).parameters if n not in ("d_model", "n_head")]
    for key in overrides:
        if key not in options:
            raise ConfigError(
                f"eval.pos_overrides.{key}: {target.__name__} has no option {key!r} "
                f"(it has: {', '.join(options) or 'none'})"
            )
    trained = instantiate_checked(pos_cfg, d_model=d_model, n_head=n_head)
    changed = instantiate_checked({**pos_cfg, **overrides}, d_model=d_model, n_head=n_head)
    before = {k: tuple(v.shape) for k, v in trained.state_dict().items()}
    after = {k: tuple(v.shape) for k, v in changed.state_dict().items()}
    if before != after:
        diff = next(k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k))
        raise ConfigError(
            f"eval.pos_overrides={overrides} changes the scheme's weights (pos.{diff}: "
            f"{before.get(diff)} trained, {after.get(diff)} with the overrides); override only "
            "options that keep the scheme's parameters"
        )
    return changed


def read_checkpoint(path: str | Path, map_location: str = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict (tensors and plain types only: weights_only=True), checked to be
    one that training wrote."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist; pass ckpt=PATH or run=RUN_DIR")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise ConfigError(f"cannot read {path} as a checkpoint ({type(err).__name__})") from None
    hparams = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    if "config" not in hparams or "vocab_size" not in hparams:
        raise ConfigError(f"{path} is not a poslab checkpoint (no stored run config)")
    return ckpt


def load_checkpoint(
    path: str | Path, pos_overrides: dict[str, Any] | None = None, map_location: str = "cpu"
) -> tuple[GPT, dict[str, Any]]:
    """(model in eval mode, resolved run config) from a checkpoint written by training.

    `pos_overrides` changes options of the positional scheme before the model is rebuilt (for
    eval-time variants such as `beyond_table=clamp`); the weights must still fit.
    """
    ckpt = read_checkpoint(path, map_location)
    hparams = ckpt["hyper_parameters"]
    config, vocab_size = hparams["config"], hparams["vocab_size"]
    if pos_overrides:
        model_cfg = config["model"]
        scheme_with_overrides(
            config["pos"], pos_overrides, model_cfg["d_model"], model_cfg["n_head"]
        )
        config = {**config, "pos": {**config["pos"], **pos_overrides}}
    model = build_model(config, vocab_size)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # a size mismatch or a missing weight, listed one per line
        detail = next((ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()), str(err))
        what = f"eval.pos_overrides={pos_overrides}" if pos_overrides else "the model config"
        raise ConfigError(
            f"{what} does not fit the weights in {path} ({detail.rstrip('.')}); "
            "change only options that keep the scheme's parameters"
        ) from None
    model.eval()
    return model, config
