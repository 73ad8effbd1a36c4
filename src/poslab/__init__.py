"""poslab: positional encodings and length extrapolation for small GPT-style language models."""

import secrets

from omegaconf import OmegaConf

__version__ = "0.1.0"

# A per-process token for run folder names (`${uid:}` in conf/hydra/default.yaml): two runs
# started in the same second get different folders. Drawn once, so every resolution of
# hydra.run.dir in this process agrees (and DDP ranks, started with hydra.run.dir set, share it).
_UID = secrets.token_hex(3)
if not OmegaConf.has_resolver("uid"):
    OmegaConf.register_new_resolver("uid", lambda: _UID)


def _eval_dir(out_dir: str | None, run: str | None, ckpt: str | None, hf: str | None = None) -> str:
    """eval.py's working folder (its eval.log): out_dir, else the evaluated run's folder, so an
    evaluation creates no folder of its own (`${eval_dir:...}` in conf/eval.yaml)."""
    from pathlib import Path

    # absolute: in an eval.py -m sweep it is the job's subfolder of the sweep folder
    if out_dir:
        return str(Path(out_dir).expanduser().absolute())
    if run:
        return str(Path(run).expanduser().absolute())
    if ckpt:
        parent = Path(ckpt).expanduser().absolute().parent
        return str(parent.parent if parent.name == "checkpoints" else parent)
    if hf:  # a pretrained model: outputs/pretrained/<name>/ (poslab/hf/pretrained.py)
        from poslab.names import pretrained_folder

        return str(pretrained_folder(str(hf)).absolute())
    import tempfile

    # neither given: eval.py stops with an error, and removes this folder again
    return str(Path(tempfile.gettempdir()) / f"poslab-eval-{_UID}")


if not OmegaConf.has_resolver("eval_dir"):
    OmegaConf.register_new_resolver("eval_dir", _eval_dir)


def _steps_label(max_steps: object, max_tokens: object) -> str:
    """The length of a run in its name: `500steps`, or `2Mtok` when a token budget decides it
    (`${steps:...}` in conf/train.yaml)."""
    if max_tokens not in (None, "None", "null"):
        tokens = float(max_tokens)  # type: ignore[arg-type]
        for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if tokens >= size:
                return f"{tokens / size:g}{unit}tok"
        return f"{tokens:g}tok"
    return f"{max_steps}steps"


if not OmegaConf.has_resolver("steps"):
    OmegaConf.register_new_resolver("steps", _steps_label)
