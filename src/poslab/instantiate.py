"""Objects built from config nodes (`_target_`), with errors a user can act on.

Below the model and the schemes (it needs Hydra, not torch or any poslab module but errors), so
the scheme registry and the eval-time variant logic can build and inspect schemes without
reaching up to build.py.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate

from poslab.errors import ConfigError


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


def scheme_options(pos_cfg: dict[str, Any]) -> dict[str, Any]:
    """The options a scheme's class takes, its own and those of the classes it extends (the
    sizes the model passes left out), with their defaults."""

    fixed = ("d_model", "n_head", "n_layer")
    options: dict[str, Any] = {}
    for cls in get_class(pos_cfg["_target_"]).__mro__:
        if "__init__" in vars(cls):
            for name, param in inspect.signature(cls.__init__).parameters.items():
                keyword = param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
                if keyword and name != "self" and name not in fixed and name not in options:
                    options[name] = param.default
    return options
