"""Build a model from a resolved run config (a plain dict), and rebuild it from a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked, scheme_options
from poslab.model.attention import kernel_from_legacy
from poslab.model.gpt import GPT, GPTConfig

# model options of checkpoints written before `attention=` was a config group
LEGACY_MODEL_KEYS = ("attention", "attn_block_size")


def attention_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run's `attention` config (or the one an older checkpoint's model options imply)."""
    return config.get("attention") or kernel_from_legacy(config["model"])


def gpt_config_of(config: dict[str, Any], vocab_size: int) -> GPTConfig:
    """The GPTConfig of a run config's `model` options (an unknown option: a ConfigError)."""
    model_cfg = {
        k: v
        for k, v in config["model"].items()
        if not k.startswith("_") and k not in LEGACY_MODEL_KEYS
    }
    try:
        return GPTConfig(vocab_size=vocab_size, **model_cfg)
    except TypeError as err:
        raise ConfigError(f"model: {err}") from None


def build_model(config: dict[str, Any], vocab_size: int) -> GPT:
    """GPT with the positional scheme of `config["pos"]` and the attention kernel of
    `config["attention"]` (each instantiated from its `_target_`)."""
    gpt_config = gpt_config_of(config, vocab_size)
    pos = build_scheme(config["pos"], gpt_config)
    return GPT(gpt_config, pos, instantiate_checked(attention_config(config)))


def scheme_target(pos_cfg: dict[str, Any]) -> type:
    """The class `pos._target_` names, checked to import and to be a PositionalScheme: a
    researcher's own scheme (docs/own-scheme.md) fails here in one line, before any work."""
    import importlib

    from poslab.positions.base import PositionalScheme
    from poslab.user import activate

    activate()  # POSLAB_USER's folders importable in every tool that builds a scheme
    target = pos_cfg.get("_target_")
    module, _, name = str(target).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None) if module else None
    except Exception as err:  # the user's module may fail in any way while it imports
        raise ConfigError(
            f"pos._target_={target} does not import ({type(err).__name__}: {err}); put its "
            "module in a POSLAB_USER folder (docs/own-scheme.md) or on PYTHONPATH"
        ) from None
    if found is None:
        raise ConfigError(f"pos._target_={target}: no class {name!r} in {module or 'it'}")
    if not (isinstance(found, type) and issubclass(found, PositionalScheme)):
        raise ConfigError(
            f"pos._target_={target} is not a PositionalScheme; subclass "
            "poslab.positions.PositionalScheme (docs/own-scheme.md)"
        )
    return found


def build_scheme(pos_cfg: dict[str, Any], gpt_config: GPTConfig) -> Any:
    scheme_target(pos_cfg)
    return instantiate_checked(
        pos_cfg, d_model=gpt_config.d_model, n_head=gpt_config.n_head, n_layer=gpt_config.n_layer
    )


def scheme_with_overrides(
    pos_cfg: dict[str, Any],
    overrides: dict[str, Any],
    gpt_config: GPTConfig,
    seq_len: int,
    trained_state: dict[str, Any] | None = None,
) -> Any:
    """The scheme rebuilt with eval-time `overrides`, checked to be options the scheme has, to
    keep its parameters' shapes (so a checkpoint's weights still load), and to change what the
    scheme computes for the trained weights (`trained_state`, the scheme's part of a checkpoint;
    else the fresh scheme's): an override that would silently do nothing is an error."""
    from hydra.utils import get_class

    target = get_class(pos_cfg["_target_"])
    options = scheme_options(pos_cfg)
    for key in overrides:
        if key not in options:
            raise ConfigError(
                f"eval.pos_overrides.{key}: {target.__name__} has no option {key!r} "
                f"(it has: {', '.join(options)})"
            )
    trained = build_scheme(pos_cfg, gpt_config)
    if all(pos_cfg.get(k, options[k]) == v for k, v in overrides.items()):
        return trained  # the trained values, said explicitly (e.g. the fp32 row of a sweep)
    changed = build_scheme({**pos_cfg, **overrides}, gpt_config)
    before = {k: tuple(v.shape) for k, v in trained.state_dict().items()}
    after = {k: tuple(v.shape) for k, v in changed.state_dict().items()}
    if before != after:
        diff = next(k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k))
        raise ConfigError(
            f"eval.pos_overrides={overrides} changes the scheme's weights (pos.{diff}: "
            f"{before.get(diff)} trained, {after.get(diff)} with the overrides); override only "
            "options that keep the scheme's parameters"
        )
    if trained_state is None:
        # before training: fresh weights (a zero-initialised table) cannot tell whether an
        # override will matter, so only its name and shapes are checked here
        return changed
    trained.load_state_dict(trained_state)
    changed.load_state_dict(trained_state)
    if _probe(trained, seq_len) == _probe(changed, seq_len):
        raise ConfigError(
            f"eval.pos_overrides={overrides} changes nothing this {target.__name__} computes "
            "with its trained weights (e.g. a base that a learnable θ replaces); drop it"
        )
    return changed


def _probe(scheme: Any, seq_len: int) -> list[Any]:
    """What a scheme computes on fixed inputs at 1-4x the training length (an exception's
    type stands for the result where the scheme refuses a length)."""
    scheme.eval()
    generator = torch.Generator().manual_seed(0)
    results: list[Any] = []
    for length in (seq_len, 4 * seq_len):
        positions = scheme.positions(1, length, torch.device("cpu"))  # eval mode: 0..T-1
        d, h = scheme.d_model, scheme.n_head
        x = torch.randn(1, length, d, generator=generator)
        q, k = torch.randn(2, 1, h, length, d // h, generator=generator)
        try:
            with torch.no_grad():
                prepared = scheme.prepare(positions)
                outputs = [scheme.embed(x, prepared), *scheme.rotate(q, k, prepared)]
                decay = scheme.data_decay(x, 0)
                outputs += [] if decay is None else [decay]
                if scheme.needs == "bias":
                    outputs.append(scheme.attention_bias(positions, positions))
                if scheme.needs == "scores":
                    future = positions[None, :] > positions[:, None]
                    q_rot, k_rot = outputs[1:3]
                    scores = q_rot @ k_rot.transpose(-1, -2)
                    fp32 = prepared.fp32
                    data = scheme.layer_data(x, 0)
                    scores = scheme.modify_scores(scores, q_rot, k_rot, future, fp32, fp32, 0, data)
                    outputs.append(scores)
            results.append([o.numpy().tobytes() for o in outputs])
        except ConfigError as err:
            results.append(type(err).__name__)
    return results


def read_checkpoint(path: str | Path, map_location: str = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict (tensors and plain types only: weights_only=True), checked to be
    one that training wrote. Whatever stops that is one line saying what the file is and what
    to do (pass another file, delete a broken one)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(_not_a_checkpoint_file(path))
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except PermissionError as err:
        raise ConfigError(
            f"cannot read checkpoint {path} ({err.strerror or err}); fix its permissions or "
            "pass another checkpoint"
        ) from None
    except Exception as err:  # torch reports a damaged archive as OSError, RuntimeError, ...
        raise ConfigError(_unreadable_checkpoint(path, err)) from None
    hparams = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    if "config" not in hparams or "vocab_size" not in hparams or "state_dict" not in ckpt:
        raise ConfigError(
            f"{path} is not a poslab checkpoint (no stored run config and weights); pass a "
            ".ckpt file that train.py wrote"
        )
    hparams["config"] = with_current_targets(hparams["config"])
    return ckpt


# classes whose module moved (issue #44: the floors became folders); a checkpoint written before
# names them by their old paths, and keeps loading
MOVED_MODULES = {
    "poslab.attention.": "poslab.model.attention.",
    "poslab.linear_attention.": "poslab.model.linear_attention.",
    "poslab.console.": "poslab.run.console.",
}


def with_current_targets(node: Any) -> Any:
    """`node` (a stored config) with every `_target_` of a moved module at its current path."""
    if isinstance(node, dict):
        return {k: with_current_targets(v) for k, v in node.items()} | (
            {"_target_": current_target(node["_target_"])} if "_target_" in node else {}
        )
    if isinstance(node, list):
        return [with_current_targets(v) for v in node]
    return node


def current_target(target: Any) -> Any:
    if isinstance(target, str):
        for old, new in MOVED_MODULES.items():
            if target.startswith(old):
                return new + target[len(old) :]
    return target


def _not_a_checkpoint_file(path: Path) -> str:
    """Why `path`, which is no file, cannot be read as a checkpoint, and what to pass instead."""
    if path.is_dir():
        # a run folder (or its checkpoints/ folder) is what run= takes
        run = path if (path / "checkpoints").is_dir() else None
        run = path.parent if path.name == "checkpoints" else run
        found = sorted(path.glob("*.ckpt")) or sorted(path.glob("checkpoints/*.ckpt"))
        example = f" such as ckpt={found[0]}" if found else ""
        instead = f", or run={run} for its best checkpoint" if run is not None else ""
        return f"checkpoint {path} is a directory; pass a .ckpt file{example}{instead}"
    if path.is_symlink() and not path.exists():
        return (
            f"checkpoint {path} is a broken symlink to {os.readlink(path)}; pass a .ckpt file "
            "that exists"
        )
    if path.exists():
        return f"checkpoint {path} is a device, pipe or socket, not a file; pass a .ckpt file"
    return f"checkpoint {path} does not exist; pass ckpt=PATH or run=RUN_DIR"


# torch.save writes a zip archive; a file that does not start like one was never a checkpoint
ZIP_MAGIC = b"PK\x03\x04"


def _unreadable_checkpoint(path: Path, err: Exception) -> str:
    """The one line for a file torch.load refused: a checkpoint cut short or damaged (what to
    do instead), one holding more than tensors, or a file that is no checkpoint at all."""
    with open(path, "rb") as f:
        zipped = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    if not zipped:  # torch's own message (a pickle error) says nothing useful here
        if path.suffix not in (".ckpt", ".pt", ".pth"):
            return (
                f"cannot read {path} as a checkpoint: it is no file torch.save wrote (not a zip "
                "archive); pass a .ckpt file that train.py wrote"
            )
        detail = "it is not a zip archive, as torch.save writes"
    elif "Weights only load failed" in str(err):
        return (
            f"{path} holds objects other than tensors and plain values, so it is no checkpoint "
            "poslab wrote (those are never unpickled); pass a .ckpt file that train.py wrote"
        )
    else:  # torch's first sentence: "PytorchStreamReader failed reading zip archive: ..."
        first = str(err).strip().split(". ")[0].splitlines()
        detail = first[0][:150] if first else type(err).__name__
    return f"checkpoint {path} is corrupt or incomplete ({detail}); {_corrupt_advice(path)}"


def _corrupt_advice(path: Path) -> str:
    """What to do with a damaged checkpoint: in a run's checkpoints/ folder, the newest other
    checkpoint of the run (elsewhere the files beside it need not be related)."""
    if path.parent.name != "checkpoints":
        return "copy it again from where it came from, or pass another checkpoint"
    others = [p for p in path.parent.glob("*.ckpt") if p.is_file() and p != path]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    if others:  # resume=FILE continues from it, ckpt=FILE evaluates it
        return f"delete it and pass the checkpoint beside it instead: {others[0]}"
    return "delete it and train the run again (no other checkpoint of the run is left)"


def load_checkpoint(
    path: str | Path, pos_overrides: dict[str, Any] | None = None, map_location: str = "cpu"
) -> tuple[GPT, dict[str, Any]]:
    """(model in eval mode, resolved run config) from a checkpoint written by training.

    `pos_overrides` changes options of the positional scheme before the model is rebuilt (for
    eval-time variants such as `beyond_table=clamp`); the weights must still fit.
    """
    return model_from_checkpoint(read_checkpoint(path, map_location), path, pos_overrides)


def model_from_checkpoint(
    ckpt: dict[str, Any], path: str | Path, pos_overrides: dict[str, Any] | None = None
) -> tuple[GPT, dict[str, Any]]:
    """load_checkpoint from a checkpoint already read (read_checkpoint): an evaluation builds
    one model per set of eval-time options from one read of the file (`path` names it in
    errors)."""
    hparams = ckpt["hyper_parameters"]
    config, vocab_size = hparams["config"], hparams["vocab_size"]
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    if pos_overrides:  # checked against the trained scheme alone (no second model)
        gpt_config = gpt_config_of(config, vocab_size)
        state = build_scheme(config["pos"], gpt_config).upgrade_state(state)
        pos_state = {k.removeprefix("pos."): v for k, v in state.items() if k.startswith("pos.")}
        scheme_with_overrides(
            config["pos"], pos_overrides, gpt_config, config["data"]["seq_len"], pos_state
        )
        config = {**config, "pos": {**config["pos"], **pos_overrides}}
    model = build_model(config, vocab_size)
    state = model.pos.upgrade_state(state)
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
