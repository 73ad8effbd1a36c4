"""`python train.py extend=RUN`: context extension by fine-tuning (issue #46).

A new run (its own folder; not a resume) starts from the weights of a finished run, its parent:
the child takes the parent's network (model.*, its scheme with the scheme's options, its attention
kernel) and its own data.seq_len, optimizer, schedule and steps. A rotary parent may be fine-tuned
with a train-time RoPE extension, `+pos.scaling.kind=K +pos.scaling.factor=s`: the `scaling`
option of the scheme that eval.rope_scaling sets at evaluation time, built the same way
(rope_scaling.scaling_options) with L = the parent's data.seq_len, so at 0 steps the child computes
exactly what the parent does evaluated with eval.rope_scaling.kind=K eval.rope_scaling.factor=s.

DroPE (Gelberg et al., ICLR 2026, "Extending the Context of Pretrained LLMs by Dropping Their
Positional Embeddings"; code github.com/SakanaAI/DroPE): `extend=RUN pos=nope` on a rotary parent
drops its positional embedding and recalibrates the network as NoPE. Their code does it by
replacing the attention of every layer with one that calls the model's own with cos = 1 and
sin = 0 (custom_models/attention.py, `nope`), the weights copied unchanged: RoPE leaves every
layer, nothing else changes (their default `attention_type: nope`; `qk_norm_nope`, which adds
new q/k RMSNorms, is a variant of theirs not built here, and so is the `softmax_scale` hook, set
by none of their run configs). Recalibration runs at the parent's training length (their run
configs keep each model's pretraining max_seq_length), so the child's data.seq_len defaults to the
parent's here. What differs from the paper, stated: the fine-tuning defaults below are poslab's
for every child; their run configs (cfgs/run_cfg/) recalibrate for longer: Llama-2-7B 5000
steps of 512 x 4096 tokens (10B, ~0.5% of its pretraining) at lr 1e-4 (a third of Llama 2's
peak), cosine, 100 warm-up steps; SmolLM-360M/1.7B 120000 steps of 512 x 2048 at lr 3e-4. Set
trainer.max_steps, optim.lr and optim.warmup_steps to match a budget. A rotary scheme has no
trained parameters (θ is fixed) unless pos.learnable_theta: a parent with trained positional
parameters, one that is not rotary (the paper drops RoPE), one over several position axes, or one
itself fine-tuned with pos.scaling is refused. The child records what it dropped in `pos.drope`
(the parent's scheme, its options and L): its rows are `nope (DroPE from rope at L=128)`, and
compare.py tells it from a NoPE trained from scratch.

What cannot work is refused in one line before any work: a parent that did not finish or has no
checkpoint, another architecture than the command line asks, a train-time kind on a scheme
without rotary pairs, a task parent on a corpus or a corpus parent on a task, another vocabulary.
The child's run.json records its parent folder and the SHA-256 of the parent's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from poslab.errors import ConfigError
from poslab.positions.nope import DROPE_CHILD as DROPE_SCHEME
from poslab.run.run_folder import RUN_SETTINGS, STATUS_FILE, read_status

log = logging.getLogger(__name__)

# the parent's checkpoint a child starts from: its final state (best.ckpt may be older)
PARENT_CHECKPOINT = Path("checkpoints") / "last.ckpt"
# the child's fine-tuning defaults where the command line does not set the key: a short
# schedule with a short warm-up (Position Interpolation fine-tuned 1000 steps, 20 warm-up) at a
# tenth of the parent's learning rate
FINE_TUNING = {"trainer.max_steps": 1000, "optim.warmup_steps": 20}
LR_FRACTION = 0.1
# the run config's group of each architecture key, and the key its choice is named by
NAMED_GROUPS = {"model": "model_name", "pos": "pos_name"}
# `extend=RUN pos=nope` on a rotary parent: DroPE (the child's scheme, and its record's key)
DROPE_RECORD = "drope"


@dataclass(frozen=True)
class Parent:
    """The finished run a child starts from: its folder, its checkpoint (read), and that file's
    SHA-256 (the lineage the child records)."""

    folder: Path
    checkpoint: Path
    sha256: str
    ckpt: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        return self.ckpt["hyper_parameters"]["config"]

    @property
    def vocab_size(self) -> int:
        return int(self.ckpt["hyper_parameters"]["vocab_size"])

    def record(self) -> dict[str, str]:
        """What the child's run.json says of its parent (runs.py lists it)."""
        return {
            "parent": str(self.folder),
            "parent_checkpoint": str(self.checkpoint),
            "parent_sha256": self.sha256,
        }

    def state_dict(self) -> dict[str, Any]:
        """The parent's network weights, named as the GPT names them."""
        return {k.removeprefix("model."): v for k, v in self.ckpt["state_dict"].items()}


def inherit_parent(cfg: DictConfig, asked: list[str] | None = None) -> Parent | None:
    """For `extend=RUN`: check the parent against the command line and give `cfg` (in place)
    the parent's architecture, the train-time scaling and the fine-tuning defaults. None (and
    `cfg` untouched) without extend. `asked`: the command line's overrides (Hydra's)."""
    from poslab.model.build import attention_config  # torch: only when a run is set up

    setting = cfg.get("extend")
    given = OmegaConf.to_container(cfg.pos, resolve=True)
    if setting in (None, ""):
        _check_without_parent(given)
        return None
    asked = command_line() if asked is None else asked
    parent = read_parent(str(setting))
    drope = drops_positions(cfg, parent.config, asked)
    _check_asked_architecture(cfg, parent.config, asked, drope)
    _inherit_data(cfg, parent.config, asked)
    _check_data_kind(cfg, parent.config)
    _check_asked_vocabulary(cfg, parent, asked)
    if drope:
        pos = _dropped_pos(given, parent, str(setting))
    else:
        pos = parent.config["pos"]
        scaling = _train_time_scaling(
            given.get("scaling"), parent.config, int(cfg.data.seq_len), str(setting)
        )
        pos = pos if scaling is None else {**pos, "scaling": scaling}
    with open_dict(cfg):
        cfg.model = parent.config["model"]
        cfg.pos = pos
        if not _asks(asked, "attention"):  # a kernel the command line names is the child's
            cfg.attention = attention_config(parent.config)
        for name in NAMED_GROUPS.values():
            if not (drope and name == "pos_name"):  # DroPE's child is named by its own pos=
                cfg[name] = parent.config.get(name) or cfg[name]
        if drope and not _asks(asked, "data.seq_len"):  # recalibrated at the parent's L
            cfg.data.seq_len = int(parent.config["data"]["seq_len"])
        theirs = int(parent.config["data"]["seq_len"])
        if not _asks(asked, "data.seq_len") and int(cfg.data.seq_len) != theirs:
            # an extension is asked by its length: a default length is said, not silent
            log.warning(
                "extend=%s: no data.seq_len given, so the child trains at the data group's "
                "default %d, not the parent's %d; set data.seq_len to choose",
                setting,
                cfg.data.seq_len,
                theirs,
            )
        _fine_tuning_defaults(cfg, parent.config, asked)
    log.info("extend=%s: starting from %s (sha256 %s)", setting, parent.checkpoint, parent.sha256)
    return parent


def extend_arguments(argv: list[str]) -> list[str]:
    """`python train.py extend=RUN ...` composed with the parent's pos= and model= first (the
    command line's own come after them and win), so that the run's folder, named before the
    run starts, names the child's scheme and model, not the defaults. One parent only: a -m
    sweep over parents keeps its arguments."""
    value = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("extend=")), None)
    if not value or "," in value:
        return argv
    try:
        settings = json.loads((Path(value).expanduser() / RUN_SETTINGS).read_text())
    except (OSError, ValueError):  # not a run folder: inherit_parent says so, in one line
        return argv
    named = [(g, settings.get(k)) for g, k in (("pos", "scheme"), ("model", "model"))]
    # DroPE (pos=nope on another parent) recalibrates at the parent's L unless told otherwise:
    # the folder is named by that length too
    chosen = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("pos=")]
    drope = chosen[-1:] == [DROPE_SCHEME] and settings.get("scheme") != DROPE_SCHEME
    length = settings.get("seq_len")
    keep = drope and isinstance(length, int) and not _asks(argv[1:], "data.seq_len")
    return [
        argv[0],
        *(f"{g}={v}" for g, v in named if isinstance(v, str)),
        *argv[1:],
        *([f"data.seq_len={length}"] if keep else []),
    ]


def read_parent(setting: str) -> Parent:
    """The parent run of extend=`setting`: a run folder whose run completed, with its final
    checkpoint (read, and hashed for the child's record)."""
    folder = Path(setting).expanduser()
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a run folder"
        raise ConfigError(f"extend={setting} {what}; pass the folder of a finished training run")
    status = read_status(folder).get("status")
    if status is None:
        raise ConfigError(
            f"extend={setting} is not a run folder (no {STATUS_FILE}); pass the folder of a "
            "finished training run"
        )
    if status == "running" and not _held(folder):
        # a SIGKILLed (or lost) run leaves its status at `running`: no process holds it now
        raise ConfigError(
            f"extend={setting}: that run stopped unfinished (its status says running, but no "
            f"process holds it: killed?); finish it first (python train.py resume={setting}) "
            "or extend a completed run"
        )
    if status != "completed":
        raise ConfigError(
            f"extend={setting}: that run is {status}, not completed; finish it first (python "
            f"train.py resume={setting}) or extend a completed run"
        )
    path = folder / PARENT_CHECKPOINT
    if not path.is_file():
        raise ConfigError(
            f"extend={setting}: the run has no {PARENT_CHECKPOINT} to start from; extend a run "
            "that kept its checkpoints"
        )
    from poslab.model.build import read_checkpoint

    try:
        ckpt = read_checkpoint(path)
    except ConfigError as err:
        if "corrupt or incomplete" not in str(err):
            raise
        # read_checkpoint's advice (pass best.ckpt) fits eval.py's ckpt=, not extend=RUN
        best = folder / "checkpoints" / "best.ckpt"
        instead = f", or copy {best} over it to start from the run's best weights instead"
        raise ConfigError(
            f"extend={setting}: its {PARENT_CHECKPOINT} is corrupt or incomplete, and extend= "
            f"starts from that file; put back an intact copy{instead if best.is_file() else ''}"
        ) from None
    return Parent(folder.resolve(), path.resolve(), file_sha256(path), ckpt)


def _held(folder: Path) -> bool:
    """Whether a training process holds the run folder's lock (the OS drops it at death)."""
    from poslab.errors import RunBusy
    from poslab.run.run_folder import RunLock

    lock = RunLock(folder)
    try:
        lock.acquire()
    except RunBusy:
        return True
    lock.put_back()
    lock.release()
    return False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def command_line() -> list[str]:
    """The overrides of this command (Hydra's record of it), [] outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _asks(asked: list[str], group: str) -> bool:
    """Whether the command line sets `group` or any key under it."""
    return any(_override_key(o) == group or _override_key(o).startswith(group + ".") for o in asked)


def _check_without_parent(pos: dict[str, Any]) -> None:
    """pos.scaling and pos.drope say how a child was made from its parent: not without one."""
    if pos.get("scaling") is not None:
        raise ConfigError(
            "pos.scaling is a train-time RoPE extension of a parent run's positions; pass "
            "extend=RUN (a finished run) with it, or use eval.rope_scaling at evaluation"
        )
    if pos.get(DROPE_RECORD) is not None:
        raise ConfigError(
            "pos.drope is what extend=RUN pos=nope records of the rotary parent it dropped; it "
            "is not set by hand: pass extend=RUN pos=nope (DroPE) instead"
        )


def drops_positions(cfg: DictConfig, parent: dict[str, Any], asked: list[str]) -> bool:
    """Whether this child is DroPE: the command line's last pos= is nope and the parent's scheme
    is another (a nope parent fine-tuned as nope is a plain child)."""
    chosen = [o.split("=", 1)[1] for o in asked if o.startswith("pos=")]
    named = chosen[-1:] == [DROPE_SCHEME] and cfg.get("pos_name") == DROPE_SCHEME
    return named and parent.get("pos_name") != DROPE_SCHEME


def _dropped_pos(given: dict[str, Any], parent: Parent, setting: str) -> dict[str, Any]:
    """The DroPE child's scheme: NoPE (the composed pos=nope), with the record of what it
    dropped; a parent DroPE does not apply to, refused."""
    from hydra.utils import get_class

    pos, name = parent.config["pos"], parent.config.get("pos_name") or "?"
    scheme = get_class(pos["_target_"])
    if not scheme.droppable:
        several = getattr(scheme, "eval_scaling", True) is False  # a multi-axis rotary scheme
        what = "over several position axes" if several else "not rotary"
        raise ConfigError(
            f"extend={setting} pos=nope: DroPE drops a rotary embedding of one position axis "
            f"(rope, xpos, p_rope, hope, resonance); the parent's pos={name} ({scheme.__name__}) "
            f"is {what}: extend it with its own scheme (drop pos=nope)"
        )
    trained = sorted(k for k in parent.state_dict() if k.startswith("pos."))
    if trained:
        raise ConfigError(
            f"extend={setting} pos=nope: the parent's pos={name} has trained parameters "
            f"({', '.join(trained)}) that NoPE would discard; DroPE drops a fixed rotation "
            "(a parent trained with pos.learnable_theta=false)"
        )
    if pos.get("scaling"):
        raise ConfigError(
            f"extend={setting} pos=nope: the parent was itself fine-tuned with pos.scaling "
            f"kind={pos['scaling'].get('kind')}; apply DroPE to a parent without it"
        )
    if given.get("scaling") is not None:
        raise ConfigError(
            f"extend={setting} pos=nope: +pos.scaling extends a rotation that DroPE drops; "
            "ask for one of them"
        )
    options = {k: v for k, v in pos.items() if k != "_target_"}
    record = {"scheme": name, "train_length": int(parent.config["data"]["seq_len"])}
    return {**given, DROPE_RECORD: {**record, "options": options}}


def _check_asked_architecture(
    cfg: DictConfig, parent: dict[str, Any], asked: list[str], drope: bool = False
) -> None:
    """Every model.* and pos.* the command line sets (pos.scaling aside) must be the parent's:
    a child is the parent's network, fine-tuned, never another one. DroPE's pos=nope is the
    exception; NoPE has no pos.* options to set."""
    for override in asked:
        key = _override_key(override)
        group = key.split(".", 1)[0]
        if drope and group == "pos":  # (+pos.scaling: _dropped_pos says why not)
            if key != "pos" and not key.startswith("pos.scaling"):
                raise ConfigError(
                    f"extend: {key} is not an option of pos=nope (DroPE: the parent's scheme "
                    f"is dropped, NoPE has no position options); drop {key} from the command line"
                )
            continue
        if group not in NAMED_GROUPS or key.startswith("pos.scaling"):
            continue
        if key == group:  # pos=NAME, model=NAME: the parent's choice, by name
            mine, theirs = cfg.get(NAMED_GROUPS[group]), parent.get(NAMED_GROUPS[group])
        else:
            mine = OmegaConf.select(cfg, key)
            theirs = OmegaConf.select(OmegaConf.create(parent), key)
            mine = OmegaConf.to_container(mine) if OmegaConf.is_config(mine) else mine
            theirs = OmegaConf.to_container(theirs) if OmegaConf.is_config(theirs) else theirs
        if mine != theirs:
            raise ConfigError(
                f"extend: {key}={mine} differs from the parent's {key}={theirs}; a child takes "
                f"its parent's architecture: drop {key} from the command line"
            )


def _inherit_data(cfg: DictConfig, parent: dict[str, Any], asked: list[str]) -> None:
    """The parent's corpus and tokenizer (its data.*), with the data.* keys the command line
    sets on top (data.seq_len, data.batch_size, ...), unless the command line picks another
    data group (data=): a child reads the tokens its parent's embeddings know."""
    named = [_override_key(o) for o in asked]
    if "data" in named:
        return
    own = {k: OmegaConf.select(cfg, k) for k in named if k.startswith("data.")}
    theirs = OmegaConf.create(parent["data"])
    for key in own:
        if OmegaConf.select(theirs, key.removeprefix("data."), default=KeyError) is KeyError:
            raise ConfigError(
                f"extend: {key} is not an option of the parent's data "
                f"(data={parent['data'].get('name', '?')}); drop it, or pick another data "
                "group with data=NAME"
            )
    with open_dict(cfg):
        seq_len = cfg.data.seq_len
        cfg.data = parent["data"]
        cfg.data.seq_len = seq_len
        for key, value in own.items():
            OmegaConf.update(cfg, key, value, force_add=True)


# the data options that decide the token ids (a missing tokenizer_version is version 1)
VOCABULARY_KEYS = {"vocab_size": None, "tokenizer": None, "tokenizer_version": 1}


def _check_asked_vocabulary(cfg: DictConfig, parent: Parent, asked: list[str]) -> None:
    """A typed data option that gives another vocabulary than the parent's config records is
    refused here, from the configs alone: check_parent_vocabulary would say so only after the
    whole corpus was tokenized."""
    if "data" in [_override_key(o) for o in asked]:  # another data group: checked later
        return
    theirs = parent.config.get("data") or {}
    for key, missing in VOCABULARY_KEYS.items():
        if not _asks(asked, f"data.{key}"):
            continue
        mine, recorded = cfg.data.get(key), theirs.get(key, missing)
        if str(mine) != str(recorded):  # '2' and 2 are one version
            raise ConfigError(
                f"extend: data.{key}={mine}, but the parent trained with data.{key}="
                f"{recorded} ({parent.vocab_size} tokens); a child reads its parent's tokens: "
                f"drop data.{key}"
            )


def _check_data_kind(cfg: DictConfig, parent: dict[str, Any]) -> None:
    """A task parent fine-tunes on a task, a corpus parent on a corpus: their vocabularies have
    nothing in common."""
    child_task, parent_task = "task" in cfg.data, "task" in (parent.get("data") or {})
    if child_task == parent_task:
        return
    theirs = parent["data"].get("name", "?")
    if parent_task:
        raise ConfigError(
            f"extend: the parent trained on the task data={theirs}, this run on the corpus "
            f"data={cfg.data.name}; fine-tune a task checkpoint on a task (data={theirs})"
        )
    raise ConfigError(
        f"extend: the parent trained on the corpus data={theirs}, this run on the task "
        f"data={cfg.data.name}; fine-tune a corpus checkpoint on its corpus (data={theirs})"
    )


def _train_time_scaling(
    given: Any, parent: dict[str, Any], seq_len: int, setting: str
) -> dict[str, Any] | None:
    """The `scaling` option the child's scheme gets from +pos.scaling.* (None: none asked):
    eval.rope_scaling's dict for the child's length, with L = the parent's data.seq_len."""
    if given is None:
        return None
    pos = parent["pos"]
    if pos.get("scaling"):  # two extensions in a row: what composing them means is not defined
        raise ConfigError(
            f"extend={setting}: the parent was itself fine-tuned with pos.scaling "
            f"kind={pos['scaling'].get('kind')}; extend it without +pos.scaling (it keeps its own)"
        )
    from poslab.positions.rope_scaling import scaling_options, train_scaling_options

    options = train_scaling_options(given)
    return scaling_options(options, pos, seq_len, int(parent["data"]["seq_len"]), train_time=True)


def _fine_tuning_defaults(cfg: DictConfig, parent: dict[str, Any], asked: list[str]) -> None:
    """A short schedule with a short warm-up at a tenth of the parent's learning rate, for each
    of those keys the command line does not set."""
    for key, value in FINE_TUNING.items():
        if not _asks(asked, key):
            OmegaConf.update(cfg, key, value)
    if not _asks(asked, "optim.lr"):
        cfg.optim.lr = float(parent["optim"]["lr"]) * LR_FRACTION


def check_parent_vocabulary(parent: Parent, vocab_size: int, tokenizer: dict | None) -> None:
    """The child's data reads tokens the parent's embeddings know: the same vocabulary (and,
    where both recorded it, the same tokenizer)."""
    theirs = parent.ckpt.get("tokenizer")
    same_tokenizer = theirs is None or tokenizer is None or theirs["json"] == tokenizer["json"]
    if vocab_size != parent.vocab_size or not same_tokenizer:
        what = (
            f"another vocabulary ({vocab_size} tokens) than the parent's ({parent.vocab_size})"
            if vocab_size != parent.vocab_size
            else f"another tokenizer than the parent's (its {vocab_size} tokens have other ids)"
        )
        raise ConfigError(
            f"extend: this run's data has {what}; fine-tune on the parent's corpus and "
            f"tokenizer (its data.*: {json.dumps(_data_settings(parent.config))})"
        )


def _data_settings(config: dict[str, Any]) -> dict[str, Any]:
    data = config.get("data") or {}
    return {k: data[k] for k in ("name", "path", "tokenizer", "vocab_size") if k in data}


def lineage_of(out: Path, parent: Parent | None, resume: Any) -> dict[str, str]:
    """What run.json says of the parent: a resumed child keeps what it recorded when it started
    (its weights came from that file, even if the parent was trained on since)."""
    if parent is None:
        return {}
    if resume is not None:
        try:
            recorded = json.loads((out / RUN_SETTINGS).read_text())
        except (OSError, ValueError):
            recorded = {}
        kept = {k: recorded[k] for k in parent.record() if k in recorded}
        if len(kept) == len(parent.record()):
            if kept["parent_sha256"] != parent.sha256:
                log.warning("extend: the parent's checkpoint changed since this child started")
            return kept
    return parent.record()


def record_effective_config(out: Path, cfg: DictConfig) -> None:
    """The child's .hydra/config.yaml made what runs: Hydra composed the defaults of pos= and
    model= before the parent's replaced them, and compare.py reads this file to tell runs apart
    and merge seeds. Hydra's own record is kept beside it as config.composed.yaml."""
    record = out / ".hydra" / "config.yaml"
    if not record.is_file():
        return
    composed = record.with_name("config.composed.yaml")
    if not composed.exists():  # a resumed child keeps the first one Hydra wrote
        os.replace(record, composed)
    tmp = record.with_name(f".config.yaml.{os.getpid()}.tmp")
    OmegaConf.save(cfg, tmp)
    os.replace(tmp, record)


def load_parent_weights(model: Any, parent: Parent) -> None:
    """The parent's weights into the child's GPT (the same network: checked before)."""
    state = model.pos.upgrade_state(parent.state_dict())
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # a size mismatch or a missing weight, listed one per line
        detail = next((ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()), str(err))
        raise ConfigError(
            f"extend: the parent's weights in {parent.checkpoint} do not fit this run's network "
            f"({detail.rstrip('.')}); extend with the parent's own model options"
        ) from None
