"""Which runner a command line names, read from argv alone (no Beam import): the package
reads it before importing Beam (beam_pipeline/__init__.py), local_runner.py after."""

from __future__ import annotations

# The runner names that mean the local runner (local_runner.py runs it).
LOCAL_RUNNERS = (None, "DirectRunner", "directrunner", "direct", "FnApiRunner")


def runner_named(argv: list[str]) -> str | None:
    """The value of the last `--runner` flag in `argv` (Beam's argparse keeps the last), or None."""
    runner = None
    for i, arg in enumerate(argv):
        if arg == "--runner" and i + 1 < len(argv):
            runner = argv[i + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner
