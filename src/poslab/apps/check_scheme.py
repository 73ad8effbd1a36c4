"""Put one positional scheme through the interface's property checks before comparing it:
`poslab-check-scheme pos=NAME [pos.KEY=VALUE ...]` (poslab/positions/properties.py says which).

The scheme may be a researcher's own (POSLAB_USER, docs/own-scheme.md). Every check runs on
every attention kernel that accepts the scheme; the table on stdout says which passed, and a
failure's line says what broke. Exit 0 when all pass, 1 when one fails, 2 on bad input.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

from poslab.errors import ConfigError, exit_on_config_error

USAGE = """usage: poslab-check-scheme pos=NAME [pos.KEY=VALUE ...]

  pos=NAME          a scheme: poslab's own or one of a POSLAB_USER folder's conf/pos/
  pos.KEY=VALUE     an option over the scheme's YAML (e.g. pos.per_layer=true), as in train.py
"""


def parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """`pos=NAME` and `pos.KEY=VALUE` arguments -> (name, options), each value read as YAML."""
    from omegaconf import OmegaConf

    from poslab.positions import scheme_names

    name, options = None, {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"{arg!r}: expected pos=NAME or pos.KEY=VALUE\n{USAGE}")
        if key == "pos":
            name = value
        elif key.startswith("pos.") and len(key) > 4:
            options[key[4:]] = OmegaConf.to_container(OmegaConf.create(f"v: {value}"))["v"]
        else:
            raise ConfigError(f"{arg!r}: only pos=NAME and pos.KEY=VALUE are taken\n{USAGE}")
    names = scheme_names()
    if name is None:
        raise ConfigError(f"name the scheme: pos=NAME (one of {', '.join(names)})")
    if name not in names:
        raise ConfigError(f"pos={name}: no such scheme; choose one of {', '.join(names)}")
    return name, options


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, options = parse(argv)
    from poslab.model.build import scheme_target
    from poslab.positions import scheme_yaml
    from poslab.positions.properties import build_scheme, scheme_checks

    scheme_target({"_target_": scheme_yaml(name)["_target_"]})  # imports, is a PositionalScheme
    # flex's eager CPU path (the reference comparison) warns that it is not compiled: known
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    build_scheme(name, **options)  # its options, checked as in training
    checks = scheme_checks(name, options)
    shown = " ".join(f"pos.{k}={v}" for k, v in options.items())
    print(f"pos={name} {shown}".strip() + f": {len(checks)} checks\n")
    print("| check | kernel | result |\n|---|---|---|")
    failed = 0
    start = time.perf_counter()
    for check, kernel, run in checks:
        try:
            run()
            result = "pass"
        except Exception as err:  # a user's scheme may fail in any way; each is reported
            failed += 1
            kind = "" if isinstance(err, AssertionError) else f"{type(err).__name__}: "
            result = "FAIL: " + kind + " ".join(str(err).split())[:300]
        print(f"| {check} | {kernel} | {result} |", flush=True)
    seconds = time.perf_counter() - start
    verdict = "all passed" if not failed else f"{failed} of {len(checks)} failed"
    print(f"\npos={name}: {verdict} ({seconds:.1f} s)")
    return 1 if failed else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
