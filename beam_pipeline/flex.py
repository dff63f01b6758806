"""Dataflow Flex Template entry point (FLEX_TEMPLATE_PYTHON_PY_FILE).

The launcher passes every parameter as `--name=value`, on/off flags too: `--flag=true|false`
becomes the CLI's bare `--flag` or nothing, so the template and the CLI take the same options.
"""

from __future__ import annotations

import argparse
import sys

from beam_pipeline.cli.options import UserError, add_flags
from beam_pipeline.main import main

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no", ""}


def convert_defaults() -> dict[str, object]:
    """ConvertOptions' flags (by name, without the leading dashes) and their defaults."""
    parser = argparse.ArgumentParser(add_help=False)
    add_flags(parser)
    return vars(parser.parse_args([]))


def normalize_argv(argv: list[str]) -> list[str]:
    """`--flag=true` -> `--flag` and `--flag=false` -> nothing, for on/off flags only.

    Raises:
      UserError: an on/off flag with a value that is not a boolean.
    """
    switches = {name for name, default in convert_defaults().items() if default is False}
    out = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name.startswith("--") and name[2:] in switches:
            if value.lower() in _TRUE:
                out.append(name)
            elif value.lower() not in _FALSE:
                raise UserError(f"{name} takes true or false, not {value!r}")
            continue
        out.append(arg)
    return out


def flex_main(argv: list[str] | None = None) -> int:
    try:
        argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    except UserError as e:
        print(f"img2tfrecord: error: {e}", file=sys.stderr)
        return 2
    return main(["convert", *argv])


if __name__ == "__main__":
    sys.exit(flex_main())
