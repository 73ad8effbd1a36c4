"""One evaluation, decided before any scoring: the eval options checked once, the trained run's
config (read once from the checkpoint), the evaluation lengths, the scheme options each length
changes (eval.pos_overrides and an eval-time RoPE variant whose factor may follow the length),
one model per distinct set of those options, the rows' labels, the device and the precision.

Text evaluation (run.py) and task evaluation (tasks.py) both score what a plan says. Before
training, the same plan is built from the run's own config (`check_before_training`), so the
evaluation after training cannot fail on an option only then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from poslab.errors import ConfigError
from poslab.model.build import model_from_checkpoint, read_checkpoint, scheme_with_overrides
from poslab.model.precision import resolve_precision
from poslab.positions.rope_scaling import eval_overrides, eval_variant_label
from poslab.run.validate import check_eval_config, eval_lengths
from poslab.tasks import build_task


@dataclass
class EvalPlan:
    """What one evaluation of a trained model scores, and how."""

    eval_cfg: Any  # the resolved eval block (a DictConfig)
    config: dict[str, Any]  # the trained run's resolved config
    lengths: list[int]
    overrides_at: dict[int, dict[str, Any]]  # length -> the scheme options it changes
    ckpt: Path | None = None  # None: planned from a run config, before training
    trained_tokens: int | None = None  # after training: what eval.max_tokens=auto caps at
    task: Any = None  # the generated task a task checkpoint is scored on
    models: dict[int, Any] = field(default_factory=dict)  # length -> model
    model_config: dict[str, Any] | None = None  # the config the models were built from
    # the run's tokenizer and the corpus files it was built from (None: a checkpoint older than
    # the record, or a generated task)
    tokenizer_record: dict[str, Any] | None = None
    other_text: str | None = None  # data_path= asked for a text other than the recorded one
    device: torch.device | None = None
    precision: str | None = None
    # a task checkpoint: {"steps_to_learn", "target"} (poslab.run.callbacks.LearningSpeed) and the
    # steps it trained
    learning: dict[str, Any] = field(default_factory=dict)
    # a pretrained HF model (eval.py hf=...): its tokenizer reads the corpus; None for poslab's
    tokenizer: Any = None
    source: str | None = None  # the hub id or folder
    # settled once the models are built, before any data is read (`settle`): the rows' scheme
    # name and eval-time variant, and length -> why the scheme cannot represent it
    scheme_name: str = ""
    variant: str = ""
    unsupported: dict[int, str] = field(default_factory=dict)

    @property
    def train_length(self) -> int:
        return int(self.config["data"]["seq_len"])

    @property
    def is_task(self) -> bool:
        return "task" in self.config["data"]

    def row_name(self) -> tuple[str, str]:
        """(the rows' scheme name, the eval-time variant): an eval-time change of the scheme is
        part of the name, `rope + yarn s=auto`."""
        eval_cfg = self.eval_cfg
        parts = [f"{k}={v}" for k, v in (eval_cfg.get("pos_overrides") or {}).items()]
        variant = ", ".join(p for p in [*parts, eval_variant_label(eval_cfg)] if p)
        config = self.model_config or self.config
        trained = self.config["pos"].get("scaling")  # a child of extend=: its train-time kind
        if config["pos"].get("scaling") != trained:  # eval.rope_scaling set it: the variant
            config = {**config, "pos": {**config["pos"], "scaling": trained}}
        scheme = scheme_label(config)
        return (f"{scheme} + {variant}" if variant else scheme), variant

    def settle(self) -> None:
        """What the rows are called and which lengths the scheme cannot represent, decided from
        the config and the built models before any data is read (eval.unsupported=error raises
        here). A text row's last position is eval.position_offset + L - 1; a task's, the largest
        position its axes give (a 1-D scheme reads the token index whatever axes it gives)."""
        self.scheme_name, self.variant = self.row_name()
        model = next(iter(self.models.values()), None)
        if model is None:
            return
        if self.task is not None:
            reads_axes = model.pos.position_axes
            max_position = self.task.max_position if reads_axes else (lambda n: n - 1)
        else:
            offset = int(self.eval_cfg.position_offset)
            max_position = lambda n: offset + n - 1  # noqa: E731
        self.unsupported = self.unsupported_lengths(max_position)

    def unsupported_lengths(self, max_position: Callable[[int], int]) -> dict[int, str]:
        """length -> why the scheme cannot represent the positions up to `max_position(length)`
        (learned positions past their table); with eval.unsupported=error the first such length
        is the error. Checked before any scoring."""
        unsupported: dict[int, str] = {}
        for length, model in self.models.items():
            try:
                model.pos.check_length(max_position(length))
            except ConfigError as err:
                if self.eval_cfg.unsupported == "error":
                    raise
                unsupported[length] = str(err)
        return unsupported


def resolved(eval_cfg: Any) -> Any:
    """The eval block with its interpolations resolved, as a DictConfig."""
    if isinstance(eval_cfg, DictConfig):
        return OmegaConf.create(OmegaConf.to_container(eval_cfg, resolve=True))
    return eval_cfg


def plan_lengths(plan_cfg: Any, config: dict[str, Any], **details: Any) -> EvalPlan:
    """The lengths of an evaluation of the run `config`, and the scheme options each changes
    (eval_cfg already checked)."""
    train_length = int(config["data"]["seq_len"])
    lengths = eval_lengths(plan_cfg, train_length)
    check_short_context(plan_cfg, lengths, "task" in config["data"])
    overrides_at = {n: eval_overrides(plan_cfg, config["pos"], n, train_length) for n in lengths}
    return EvalPlan(plan_cfg, config, lengths, overrides_at, **details)


def plan_checkpoint(
    ckpt: str | Path,
    eval_cfg: Any,
    trained_tokens: int | None = None,
    refuse_corpus_options: bool = False,
    checked: bool = False,
    given: set[str] | None = None,
) -> EvalPlan:
    """The plan of evaluating `ckpt`: the options checked (unless the caller did: `checked`),
    the checkpoint read once, and its models built. `refuse_corpus_options` (eval.py): a task
    checkpoint with corpus-only options set is an error, not a note. `given` (eval.py): the eval
    options typed on its command line; every other option that decides what is scored is the
    one the run recorded (recorded.py), and a line says which were taken."""
    eval_cfg = resolved(eval_cfg)
    if not checked:
        check_eval_config(eval_cfg)
    checkpoint = read_checkpoint(ckpt)
    config = checkpoint["hyper_parameters"]["config"]
    if given is not None:
        eval_cfg = recorded_settings(eval_cfg, config, Path(ckpt), given, checkpoint)
    if refuse_corpus_options and "task" in config["data"]:
        unused = corpus_options_set(eval_cfg)  # scored per example: they would be ignored
        if unused:
            raise ConfigError(task_options_error(ckpt, config, unused))
    plan = plan_lengths(eval_cfg, config, ckpt=Path(ckpt), trained_tokens=trained_tokens)
    load_models(plan, checkpoint)
    return plan


def recorded_settings(
    eval_cfg: Any, config: dict[str, Any], ckpt: Path, given: set[str], checkpoint: dict
) -> Any:
    """eval_cfg with the run's recorded scoring options where none was given, said in a line."""
    from poslab.evaluation.recorded import replaced_settings, with_recorded_settings

    if "*" in given and (replaced := replaced_settings(eval_cfg, config)):
        print(
            f"scoring as the eval group given says, not as the run's own evaluation did: "
            f"{' '.join(replaced)} (the run's record) not taken; type any of them to keep it",
            flush=True,
        )
    data = config["data"]
    accumulate = int(config["trainer"].get("accumulate_grad_batches") or 1)
    steps = int(checkpoint.get("global_step") or 0)
    trained = steps * int(data["batch_size"]) * int(data["seq_len"]) * accumulate or None
    eval_cfg, taken = with_recorded_settings(eval_cfg, config, ckpt, given, trained)
    short = eval_cfg.get("short_context")
    came = any(t.startswith("eval.short_context=") for t in taken)
    if came and short and "nonoverlapping" not in list(eval_cfg.modes or []):
        # check_short_context would refuse it as if typed: say where the c came from
        modes = ",".join(map(str, eval_cfg.modes or []))
        raise ConfigError(
            f"eval.modes=[{modes}]: the run's own evaluation measured context use "
            f"(eval.short_context={short}, taken from the run's record), which needs "
            "non-overlapping rows; add nonoverlapping to eval.modes, or set "
            "eval.short_context=null"
        )
    if taken:
        print(
            f"scoring as the run's own evaluation did: {' '.join(taken)} (the run's record; "
            "set any of them to change it, e.g. eval.max_tokens=null for the whole split)",
            flush=True,
        )
        check_eval_config(eval_cfg)
    return eval_cfg


def load_models(plan: EvalPlan, checkpoint: dict[str, Any]) -> None:
    """One model per distinct set of eval-time scheme options, each built and checked before
    any work; the task of a task checkpoint, checked at every length; device and precision."""
    built: dict[str, Any] = {}  # repr(overrides) -> (model, config)
    for length in plan.lengths:
        key = repr(plan.overrides_at[length])
        if key not in built:
            built[key] = model_from_checkpoint(checkpoint, plan.ckpt, plan.overrides_at[length])
    plan.models = {n: built[repr(plan.overrides_at[n])][0] for n in plan.lengths}
    plan.model_config = next(iter(built.values()))[1]
    plan.tokenizer_record = checkpoint.get("tokenizer")
    if plan.is_task:
        plan.learning = {
            **(checkpoint.get("learning") or {}),
            "trained_steps": checkpoint.get("global_step"),
        }
        plan.task = build_task(plan.model_config["data"])
        for length in plan.lengths:
            plan.task.check_length(length, key="eval length")
    plan.device = pick_device(plan.eval_cfg.device)
    plan.precision = resolve_precision(
        plan.eval_cfg.precision, plan.device.type, key="eval.precision"
    )
    plan.settle()


def plan_pretrained(
    source: str,
    context: int | None,
    eval_cfg: Any,
    wandb: bool,
    trust_remote_code: bool = False,
) -> EvalPlan:
    """The plan of evaluating a pretrained HF causal LM (eval.py hf=SOURCE): lengths as multiples
    of its trained context, one wrapped model per eval-time setting (they share the HF model:
    frequencies in its rotary module, or rerope, selfextend, lminfinite and log-n through the
    attention hook), checked on a probe before any scoring (pretrained.py)."""
    from poslab.hf.pretrained import load_pretrained, models_per_length, trained_context
    from poslab.names import pretrained_name
    from poslab.positions.rope_scaling import eval_variant_options

    eval_cfg = resolved(eval_cfg)
    check_eval_config(eval_cfg)
    options = eval_variant_options(eval_cfg)
    if eval_cfg.get("pos_overrides"):
        raise ConfigError(
            f"eval.pos_overrides={dict(eval_cfg.pos_overrides)}: options of poslab's schemes, "
            f"which hf={source} has none of; leave it out"
        )
    device = pick_device(eval_cfg.device)
    precision = resolve_precision(eval_cfg.precision, device.type, key="eval.precision")
    hf_model, tokenizer = load_pretrained(source, device, precision, trust_remote_code)
    context = trained_context(hf_model, source, context)
    name = pretrained_name(source)
    config: dict[str, Any] = {
        "pos_name": name,
        "pos": {},
        "data": {"seq_len": context, "word_level": False, "tokenizer": "pretrained"},
        "model": {"pretrained": source},
        "run_name": name,
    }
    if wandb:  # eval.py hf=... logs to W&B as a trained run would (offline unless logged in)
        config["logger"] = {"_target_": "WandbLogger", "project": "poslab", "group": "pretrained"}
    plan = EvalPlan(eval_cfg, config, [], {}, tokenizer=tokenizer, source=source)
    plan.lengths = eval_lengths(eval_cfg, context)
    plan.models = models_per_length(hf_model, source, options, plan.lengths, context, device)
    plan.model_config = config
    plan.device, plan.precision = device, precision
    plan.settle()
    return plan


def check_before_training(
    config: dict[str, Any], gpt_config: Any, scheme: Any, task: Any = None
) -> EvalPlan:
    """The evaluation after training, planned from the run's config before any work: its
    options, the eval-time overrides at every length, and (eval.unsupported=error) every length
    the scheme must represent, with the scheme the evaluation uses at its longest length."""
    eval_cfg = resolved(OmegaConf.create(config["eval"]))
    check_eval_config(eval_cfg)  # a typo fails now, not after training
    unused = corpus_options_set(eval_cfg) if task is not None else []
    if unused:  # eval.py refuses them on a task checkpoint; training took them without a word
        raise ConfigError(task_options_error("this run", config, unused))
    plan = plan_lengths(eval_cfg, config, task=task)
    train_length = plan.train_length
    overrides = plan.overrides_at[plan.lengths[-1]]
    if overrides:
        scheme = scheme_with_overrides(config["pos"], overrides, gpt_config, train_length)
    if eval_cfg.unsupported == "error":
        reads_axes = task is not None and scheme.position_axes
        offset = int(eval_cfg.position_offset)
        for length in plan.lengths:
            last = task.max_position(length) if reads_axes else offset + length - 1
            scheme.check_length(last)
    return plan


def scheme_label(config: dict) -> str:
    """A trained model's name in tables: the scheme, a training-time variant of it (`rope
    randomized N=2048`, `learned concatenated (16 of 64 dims)`), a train-time RoPE extension of
    a child of extend= (`rope + yarn s=4, fine-tuned from L=128`), a NoPE child of a rotary run
    (DroPE: `nope (DroPE from rope at L=128)`), a gate or sinks in the attention
    (`rope, headwise gate`, `alibi, sinks`), and an attention that is not softmax or has a window
    (`rope, linear attention`, `nope, stick-breaking`)."""
    scheme = config.get("pos_name") or config["pos"]["_target_"].rsplit(".", 1)[-1]
    randomized = config["pos"].get("randomize_max")
    label = f"{scheme} randomized N={randomized}" if randomized else scheme
    if config["pos"].get("layers"):  # a scheme per layer: the pattern
        label += " " + "/".join(map(str, config["pos"]["layers"]))
    if config["pos"].get("combine") == "concat":  # the width split, stated
        d_model = config.get("model", {}).get("d_model")
        dims = config["pos"].get("position_dims") or (d_model // 4 if d_model else "d/4")
        label += f" concatenated ({dims} of {d_model or 'd'} dims)"
    dropped = config["pos"].get("drope")
    if dropped:  # extend=RUN pos=nope: a rotary parent's embedding dropped, recalibrated
        label += f" (DroPE from {dropped['scheme']} at L={dropped['train_length']})"
    scaling = config["pos"].get("scaling")
    if scaling:  # extend=: fine-tuned past its parent's L with a train-time RoPE extension
        from poslab.positions.rope_scaling import fine_tuned_label

        label += " + " + fine_tuned_label(scaling)
    model = config.get("model") or {}
    if model.get("gate"):  # a model option, not a scheme: part of the name all the same
        label += f", {model['gate']} gate"
    if model.get("sinks"):
        label += ", sinks"
    attention = config.get("attention") or {}
    if attention.get("_target_"):
        from hydra.utils import get_class

        kernel_label = get_class(attention["_target_"]).row_label(attention)
        label += f", {kernel_label}" if kernel_label else ""
    return label


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("eval.device=cuda but no CUDA device is visible; use eval.device=cpu")
    return torch.device(name)


# The options of a corpus evaluation that a task's evaluation does not use: there are no
# windows over a split, every example is scored whole from position 0. eval.py refuses them for
# a task checkpoint; the evaluation after training, which shares the run's eval block with
# corpus runs, says it ignores them.


def check_short_context(eval_cfg: Any, lengths: list[int], task: bool) -> None:
    """eval.short_context measures non-overlapping rows longer than c: a setting that measures
    no row is one line, not a table without it (tasks: corpus_options_set says so)."""
    from poslab.evaluation.context_use import DEFAULT_THRESHOLD

    short = eval_cfg.get("short_context")
    threshold = eval_cfg.get("gain_threshold")
    if not short and threshold not in (None, DEFAULT_THRESHOLD):
        # the threshold only splits context use's gains: alone it would measure nothing
        raise ConfigError(
            f"eval.gain_threshold={threshold} is read only by context use; set "
            "eval.short_context=c too (e.g. the training length / 4), or leave it out"
        )
    if not short or task:
        return
    if "nonoverlapping" not in list(eval_cfg.modes or []):
        raise ConfigError(
            f"eval.short_context={short} measures non-overlapping rows; add nonoverlapping to "
            "eval.modes (e.g. eval.modes=[nonoverlapping,sliding])"
        )
    if not any(n > short for n in lengths):
        raise ConfigError(
            f"eval.short_context={short} is not below any evaluation length "
            f"({', '.join(map(str, lengths))}): context use compares the full window with a "
            "shorter one; lower it (e.g. the training length / 4)"
        )


def corpus_options_set(eval_cfg: Any) -> list[str]:
    """The corpus-only eval options set to something a task's evaluation would silently
    ignore, as `key=value` (eval.py's defaults, and after training's max_tokens=auto, are not
    listed)."""
    modes = list(eval_cfg.modes or [])
    found = [f"eval.modes=[{','.join(map(str, modes))}]"] if modes != ["nonoverlapping"] else []
    defaults = {"stride": None, "bucket_size": None, "position_offset": 0, "split": "validation"}
    for key, unused in defaults.items():
        if eval_cfg.get(key, unused) != unused:
            found.append(f"eval.{key}={eval_cfg[key]}")
    if eval_cfg.get("max_tokens") not in (None, "auto"):
        found.append(f"eval.max_tokens={eval_cfg.max_tokens}")
    if eval_cfg.get("documents"):  # documents replace a corpus split, which a task has none of
        found.append(f"eval.documents={eval_cfg.documents}")
    if eval_cfg.get("short_context"):  # context use is measured over a corpus split
        found.append(f"eval.short_context={eval_cfg.short_context}")
    return found


def task_options_error(ckpt: str | Path, trained: dict, unused: list[str]) -> str:
    name = trained["data"].get("name") or "a task"
    return (
        f"{', '.join(unused)}: {ckpt} {'trains' if ckpt == 'this run' else 'was trained'} on a "
        f"generated task (data={name}), which is "
        "scored on fresh examples (eval.task_examples per length), each in one forward pass from "
        "position 0, not by windows over a corpus split; leave "
        f"{'this option' if len(unused) == 1 else 'these options'} out"
    )
