"""The schema covers every option the config files define (issue #43): `model.bias=maybe` was
once accepted because the hand-written schema had no entry for it. Each leaf of the YAML defaults
(conf/train.yaml and its groups) must have a check in validate.py's schemas, or belong to a
group of options that a module checks itself, named here with where; a new key without either
fails this test, so it cannot go unchecked."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from poslab.run.validate import EVAL_SCHEMA, TRAIN_SCHEMA

CONF = Path(__file__).resolve().parents[2] / "src" / "poslab" / "conf"
GROUPS = ("data", "model", "trainer", "eval", "logger", "attention", "callbacks")

# options checked by the module they configure, before any work (each has tests of its own)
CHECKED_BY = {
    "data.tokenizer": "poslab.data.tokens.check_tokenizer",
    "data.vocab_size": "poslab.data.tokens.check_tokenizer",
    "data.task.": "each task's dataclass (tasks/), built by validate._check_task",
    "attention.": "each kernel's options, built by validate._check_model",
    "eval.rope_scaling.": "positions/rope_scaling (eval_overrides), built by the eval plan",
    "eval.logn_scaling": "positions/rope_scaling, built by the eval plan",
    "eval.pos_overrides": "the scheme built with them, by the eval plan",
    "trainer.strategy": "trainer/ddp.yaml, fsdp.yaml: Lightning's strategy, built before data",
    "trainer.accelerator": "lightning.Trainer, built before any data is read",
    "trainer.devices": "training.world_size_for, before any work",
    "after_training.": "each step's own check(), by validate.after_training_steps",
    "callbacks.": "each callback built by training.configured_callbacks, before any work",
    "pos_name": "Hydra's choice of pos=",
    "model_name": "Hydra's choice of model=",
}


def leaves(node: dict, prefix: str) -> list[str]:
    keys = []
    for key, value in node.items():
        if key in ("defaults", "hydra", "_target_"):
            continue
        if isinstance(value, dict) and value:
            keys += leaves(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def default_keys() -> set[str]:
    keys = set(leaves(OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml")), ""))
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            keys |= set(leaves(OmegaConf.to_container(OmegaConf.load(path)), f"{group}."))
    return keys


def test_the_config_files_have_the_keys_this_test_walks():
    keys = default_keys()
    assert {"model.bias", "data.word_level", "trainer.max_steps", "eval.max_tokens"} <= keys
    assert any(k.startswith("data.task.") for k in keys)


@pytest.mark.parametrize("key", sorted(default_keys()))
def test_every_option_of_the_config_files_is_checked(key):
    checked = key in TRAIN_SCHEMA or key in EVAL_SCHEMA
    delegated = [where for prefix, where in CHECKED_BY.items() if key.startswith(prefix)]
    assert checked or delegated, (
        f"{key} has no check: add one to validate.py's TRAIN_SCHEMA or EVAL_SCHEMA (or, if a "
        "module checks it before any work, name it in CHECKED_BY)"
    )
