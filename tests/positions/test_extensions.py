"""positions/extensions/: each kind's file of conf/extension/ names its class and lists exactly
the options the class reads, with the class's defaults; eval.rope_scaling in
conf/eval/default.yaml has a key for each (so `eval.rope_scaling.OPTION=V` needs no `+`)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from poslab.errors import ConfigError
from poslab.positions.extensions import EXTENSION_CONF, extension_defaults, extension_names
from poslab.positions.rope_scaling import RopeScaling


@pytest.mark.parametrize("kind", extension_names())
def test_a_kinds_file_lists_its_options_with_the_class_defaults(kind):
    cls, defaults = extension_defaults(kind)
    assert set(defaults) == set(cls.option_names())
    for name, value in defaults.items():
        value = tuple(value) if isinstance(value, list) else value  # a YAML list: the tuple
        assert value == cls.__dataclass_fields__[name].default, (kind, name)


def test_the_eval_config_has_a_key_for_every_kinds_option():
    block = OmegaConf.load(EXTENSION_CONF.parent / "eval" / "default.yaml").rope_scaling
    for kind in extension_names():
        missing = set(extension_defaults(kind)[0].option_names()) - set(block)
        assert not missing, (kind, missing)


@pytest.mark.parametrize("kind", [7, ["yarn"], "Yarn", "../eval/default"])
def test_a_kind_that_is_none_of_the_files_is_one_line(kind):
    with pytest.raises(ConfigError, match="choose one of none, "):
        RopeScaling(kind, 2.0, 64)


def test_score_kinds_need_scores_and_ignore_the_factor():
    for kind in extension_names():
        cls = extension_defaults(kind)[0]
        if cls.needs_scores:
            assert not cls.uses_factor, kind
    assert {k for k in extension_names() if extension_defaults(k)[0].needs_scores} == {
        "rerope",
        "selfextend",
        "lminfinite",
        "string",
        "dpe",
    }
