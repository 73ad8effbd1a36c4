"""Build a model from a resolved run config (a plain dict), and rebuild it from a checkpoint."""

from __future__ import annotations

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
        raise ConfigError(f"cannot build {target}: {err.__cause__ or err}") from None


def build_model(config: dict[str, Any], vocab_size: int) -> GPT:
    """GPT with the positional scheme of `config["pos"]` (instantiated from its `_target_`)."""
    model_cfg = {k: v for k, v in config["model"].items() if not k.startswith("_")}
    gpt_config = GPTConfig(vocab_size=vocab_size, **model_cfg)
    pos = instantiate_checked(config["pos"], d_model=gpt_config.d_model, n_head=gpt_config.n_head)
    return GPT(gpt_config, pos)


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
