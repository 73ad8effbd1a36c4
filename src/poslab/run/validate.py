"""The run config checked before any work: types, ranges and choices of every option a user sets.

A schema is a mapping from a dotted key to a check (checks.py); keys a config does not have are
skipped, so one schema serves every data module and model. Options that only a positional scheme
knows are checked by the scheme's own constructor, which `check_run_config` calls before any data
is read (the scheme is cheap to build).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from poslab.checks import (
    Check,
    boolean,
    check_schema,
    choice,
    integer,
    is_int,
    is_number,
    list_of,
    number,
    text,
)
from poslab.errors import ConfigError


def val_batches(value: Any) -> str | None:
    """Lightning's limit_val_batches: a count ≥ 1, or a fraction of the split in (0, 1]."""
    if is_int(value) and value >= 1:
        return None
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return None
    return "must be a number of batches ≥ 1 or a fraction in (0, 1]"


def betas(value: Any) -> str | None:
    if not isinstance(value, list | tuple | ListConfig) or len(value) != 2:
        return "must be two numbers, e.g. [0.9,0.95]"
    if any(not is_number(b) or not 0.0 <= b < 1.0 for b in value):
        return "must be two numbers in [0, 1)"
    return None


def resume_setting(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    return "must be auto, a run folder or a checkpoint file (or null)"


def path_setting(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    return "must be a path (or null)"


def progress_bar_setting(value: Any) -> str | None:
    return None if isinstance(value, bool) or value == "auto" else "must be auto, true or false"


def log_model_setting(value: Any) -> str | None:
    return None if isinstance(value, bool) or value == "all" else "must be true, false or all"


def max_tokens_setting(value: Any) -> str | None:
    if value is None or value == "auto" or (is_int(value) and value >= 2):
        return None
    return "must be a number of tokens ≥ 2, auto, or null (the whole split)"


# what poslab runs (precision.PRECISIONS; kept here too, so the checks need no torch import):
# Lightning's other strings (32, bf16-true, 64-true) would fail only once the work was done
PRECISION_CHOICES = ("auto", "32-true", "bf16-mixed", "16-mixed")
# lightning.seed_everything takes seeds in [0, 2**32 - 1]
MAX_SEED = 2**32 - 1

TRAIN_SCHEMA: dict[str, Check] = {
    "seed": integer(0, MAX_SEED),
    "optim.lr": number(gt=0),
    "optim.weight_decay": number(ge=0),
    "optim.betas": betas,
    "optim.eps": number(gt=0),
    "optim.warmup_steps": integer(0),
    "optim.min_lr_ratio": number(ge=0, le=1),
    "optim.pos_lr_scale": number(ge=0),
    "data.name": text(),
    "data.hub_id": text(null=True),
    "data.hub_config": text(null=True),
    "data.cache_dir": text(),
    "data.path": path_setting,
    "data.position_axes": integer(1),
    "data.seq_len": integer(1),
    "data.batch_size": integer(1),
    "data.eval_batch_size": integer(1, null=True),
    "data.num_workers": integer(0),
    "data.valid_fraction": number(ge=0, lt=1),
    "data.loss_on": choice("answer", "all"),
    "data.val_examples": integer(1),
    "model.n_layer": integer(1),
    "model.n_head": integer(1),
    "model.d_model": integer(1),
    "model.d_ff": integer(1, null=True),
    "model.dropout": number(ge=0, lt=1),
    "model.bias": boolean(),
    "model.scale_embeddings": boolean(),
    "model.gate": choice(None, "headwise", "elementwise"),
    "model.sinks": boolean(),
    "data.word_level": boolean(),
    "trainer.max_steps": integer(1),
    "trainer.val_check_interval": integer(1),
    "trainer.limit_val_batches": val_batches,
    "trainer.limit_train_batches": val_batches,  # 0 trained nothing, then failed in eval
    "trainer.gradient_clip_val": number(ge=0, null=True),
    "trainer.accumulate_grad_batches": integer(1),
    "trainer.log_every_n_steps": integer(1),
    "trainer.precision": choice(*PRECISION_CHOICES),
    "trainer.compile": boolean(),
    "trainer.num_sanity_val_steps": integer(-1),
    "trainer.enable_progress_bar": progress_bar_setting,
    "trainer.enable_model_summary": boolean(),
    "trainer.benchmark": boolean(null=True),
    "trainer.num_nodes": integer(1),
    "train.max_tokens": integer(1, null=True),
    "train.validate_before_fit": boolean(),
    "train.fingerprints": boolean(),
    "train.stop_at_accuracy": number(ge=0, le=1, null=True),
    "checkpoint.every_n_steps": integer(1, null=True),
    "resume": resume_setting,
    "extend": path_setting,
    "logger.init_timeout": number(gt=0),
    "logger.project": text(),
    "logger.name": text(),
    "logger.group": text(null=True),
    "logger.job_type": text(),
    "logger.offline": boolean(null=True),
    "logger.log_model": log_model_setting,
    "run_name": text(),
}

EVAL_SCHEMA: dict[str, Check] = {
    "eval.after_train": boolean(),
    "eval.split": choice("validation", "test"),
    "eval.lengths": list_of(integer(1), null=True),
    "eval.factors": list_of(number(gt=0)),
    "eval.modes": list_of(choice("nonoverlapping", "sliding")),
    "eval.stride": integer(1, null=True),
    "eval.max_tokens": max_tokens_setting,
    "eval.batch_size": integer(1, null=True),
    "eval.position_offset": integer(0),
    "eval.bucket_size": integer(1, null=True),
    "eval.short_context": integer(1, null=True),
    "eval.gain_threshold": number(gt=0),
    "eval.unsupported": choice("error", "skip"),
    "eval.precision": choice(*PRECISION_CHOICES),
    "eval.device": choice("auto", "cpu", "cuda"),
    "eval.log_wandb": boolean(),
    "eval.task_examples": integer(1),
    "eval.learned_at": number(ge=0, le=1),
    "eval.documents": path_setting,
    "eval.max_documents": integer(1, null=True),
    "eval.min_document_tokens": integer(1, null=True),
}


def eval_lengths(eval_cfg: Any, train_length: int) -> list[int]:
    if eval_cfg.lengths:
        key, given, lengths = "eval.lengths", list(eval_cfg.lengths), list(eval_cfg.lengths)
    else:
        key, given = "eval.factors", list(eval_cfg.factors)
        lengths = [int(f * train_length) for f in given]
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ConfigError(
            f"{key}={given} gives evaluation lengths {lengths} for a training length of "
            f"{train_length}; every length must be ≥ 1"
        )
    return sorted({int(n) for n in lengths})


def check_eval_config(eval_cfg: Any) -> None:
    """The eval options that need no checkpoint, checked before any work (train.py calls this
    before training, so a typo does not surface only after the run)."""
    if isinstance(eval_cfg, DictConfig):
        eval_cfg = OmegaConf.to_container(eval_cfg, resolve=True)
    check_schema({"eval": eval_cfg}, EVAL_SCHEMA)
    overrides = eval_cfg.get("pos_overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(
            f"eval.pos_overrides={overrides!r} must be a mapping, e.g. {{beyond_table: clamp}}"
        )
    from poslab.positions.rope_scaling import eval_variant_options

    eval_variant_options(eval_cfg)  # the eval-time variant's own options
    _check_documents(eval_cfg)
    if eval_cfg.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("eval.device=cuda but no CUDA device is visible; use eval.device=cpu")


def _check_documents(eval_cfg: dict[str, Any]) -> None:
    """eval.documents (data/documents.py): the options it replaces or needs, and its
    source, checked before any model is loaded."""
    documents = eval_cfg.get("documents")
    if not documents:
        for key in ("max_documents", "min_document_tokens"):
            if eval_cfg.get(key) is not None:
                raise ConfigError(
                    f"eval.{key}={eval_cfg[key]} chooses among eval.documents, which is not "
                    f"set; pass eval.documents=PATH or leave eval.{key} out"
                )
        return
    modes = list(eval_cfg.get("modes") or [])
    if modes != ["nonoverlapping"]:
        # each document is one window from position 0: a sliding window has no stream to slide
        raise ConfigError(
            f"eval.modes=[{','.join(map(str, modes))}] with eval.documents: each document is "
            "scored once, as one window of its first L tokens; set eval.modes=[nonoverlapping]"
        )
    max_tokens = eval_cfg.get("max_tokens")
    if max_tokens not in (None, "auto"):
        raise ConfigError(
            f"eval.max_tokens={max_tokens} caps a corpus split, which eval.documents replaces; "
            "cap the documents with eval.max_documents=K instead"
        )
    from poslab.data.documents import check_source

    check_source(documents)


def check_run_config(cfg: DictConfig) -> list[Any]:
    """Every option of a training run checked before any work (and before Lightning is
    imported): the schema (types, ranges, choices), the model and the scheme (built once,
    cheaply, so their own checks run), the training length, and what runs after training
    (`after_training:`, e.g. the evaluation at every length, with its eval-time overrides).
    Returns those after-training steps, built."""
    missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra."))
    if missing:  # a `???` of a config file: say which key, in full
        raise ConfigError(f"{missing[0]} has no value and needs one; pass {missing[0]}=VALUE")
    check_schema(cfg, TRAIN_SCHEMA)
    check_schema(cfg, EVAL_SCHEMA)
    if "tokenizer" in cfg.data:  # text: the tokenizer checks its settings (poslab.data.tokens)
        from poslab.data.tokens import check_tokenizer

        check_tokenizer(cfg.data.tokenizer, cfg.data.get("vocab_size"))
    _check_data_path(cfg.data.get("path"))
    config = OmegaConf.to_container(cfg, resolve=True)
    gpt_config, scheme = _check_model(config)
    task = _check_task(config, scheme)
    steps = after_training_steps(config)
    for step in steps:
        if hasattr(step, "check"):
            step.check(config, gpt_config, scheme, task)
    return steps


def _check_data_path(path: Any) -> None:
    if path is not None and not Path(str(path)).expanduser().exists():
        folder = Path(str(path)).expanduser()
        broken = f" (a broken symlink to {os.readlink(folder)})" if folder.is_symlink() else ""
        raise ConfigError(
            f"data.path={path} does not exist{broken}; point it at a folder of split files"
        )


def _check_model(config: dict[str, Any]) -> tuple[Any, Any]:
    """The model's options, the scheme's and the attention kernel's (each built, cheaply), and
    the training length: (the GPT config, the scheme)."""
    from poslab.instantiate import instantiate_checked
    from poslab.model.build import (  # torch, not before
        attention_config,
        build_scheme,
        gpt_config_of,
    )
    from poslab.model.precision import device_type_of

    gpt_config = gpt_config_of(config, vocab_size=2)
    scheme = build_scheme(config["pos"], gpt_config)
    kernel = instantiate_checked(attention_config(config))
    kernel.check(scheme, gpt_config.dropout, gpt_config.sinks)
    accelerator = str(config["trainer"].get("accelerator", "auto"))
    if (
        str(config["trainer"].get("precision")) == "16-mixed"
        and device_type_of(accelerator) == "cpu"
    ):
        # Lightning would train bf16-mixed instead, with a warning, while the run's log and
        # saved config said 16-mixed (issue #43)
        raise ConfigError(
            "trainer.precision=16-mixed (fp16 autocast) trains on CUDA GPUs only, and this run "
            "trains on the CPU; use bf16-mixed, 32-true or auto"
        )
    if not kernel.trains_on_cpu and device_type_of(accelerator) != "cuda":
        raise ConfigError(
            f"attention={kernel.name} trains on CUDA GPUs only (FlexAttention has no backward "
            "pass on CPUs); train with attention=sdpa (evaluating with it works on CPUs)"
        )
    seq_len = config["data"]["seq_len"]
    scheme.check_length(scheme.max_training_position(seq_len))
    _check_window(kernel, config, seq_len)
    return gpt_config, scheme


def _check_window(kernel: Any, config: dict[str, Any], seq_len: int) -> None:
    """A sliding window as long as every length the run trains and evaluates hides no key."""
    windows = kernel.window if isinstance(kernel.window, tuple) else (kernel.window,)
    longest = max([seq_len, *eval_lengths(OmegaConf.create(config["eval"]), seq_len)])
    for window in windows:
        if window is not None and window >= longest:
            raise ConfigError(
                f"attention.window={window} is at least the longest length this run trains or "
                f"evaluates ({longest}), so it hides no key; choose a window below "
                f"{longest} (below data.seq_len={seq_len} to train with it), or null"
            )


def _check_task(config: dict[str, Any], scheme: Any) -> Any:
    """A generated task (data=passkey, ...), built: its positions must suit the scheme."""
    if not config["data"].get("task"):
        if (config.get("train") or {}).get("stop_at_accuracy") is not None:
            raise ConfigError(
                "train.stop_at_accuracy needs a generated task (data=needle, copy, ...): a "
                "corpus has no answer accuracy; remove it or pick a task"
            )
        return None
    if (config.get("train") or {}).get("stop_at_accuracy") is not None and (
        config["data"].get("loss_on") != "answer"
    ):
        raise ConfigError(
            "train.stop_at_accuracy reads val/accuracy, the exact match of the answer, which "
            "validation scores with data.loss_on=answer only; set data.loss_on=answer"
        )
    from poslab.instantiate import instantiate_checked

    task = instantiate_checked(config["data"]["task"])
    task.check_length(config["data"]["seq_len"])
    if scheme.position_axes and task.position_axes not in (0, scheme.position_axes):
        raise ConfigError(
            f"pos={config.get('pos_name') or 'this scheme'} takes {scheme.position_axes} "
            f"position axes but data={task.name} gives {task.position_axes} per token; set "
            f"pos.axes={task.position_axes}"
        )
    return task


def after_training_steps(config: dict[str, Any]) -> list[Any]:
    """What the config's `after_training:` names (a mapping of `_target_` nodes), built in
    order: training calls each once it is done, and knows nothing else of them."""
    from poslab.instantiate import instantiate_checked

    nodes = config.get("after_training") or {}
    return [instantiate_checked(node) for node in nodes.values() if node]
