"""The CLI process's set-up before Beam is imported: the one place that changes process-wide state.

Called only by the console entry (beam_pipeline/__main__.py): importing the package, or
calling `main.run()`, changes none of it (tests/cli/test_startup.py). Each item is a tested
correctness fix or a start-up gain measured outside the spread (benchmarks/README.md "Start-up"):

- `GRPC_ENABLE_FORK_SUPPORT=false` (correctness): with it on, gRPC restarts its poller in every
  forked child before exec; `subprocess` closes the poller's descriptors and gRPC aborts the
  child (SIGABRT, 3-12 in 1,000 here; grpc/grpc#43055). Beam's own tests turn it off too.
- The interpreter's last collection skipped (`before_exit`): it would walk the ~1 million
  objects of Beam's modules and the graph once more.
- Beam imported without the client libraries of IOs and runners a local run never uses
  (SKIPPED_BY_LOCAL_RUNS), which Beam imports under `try: ... except ImportError` (checked
  against BEAM_CHECKED: an upgrade fails tests/cli/test_startup.py until checked again).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys

# The runner names that mean the local runner (local_runner.py runs it).
LOCAL_RUNNERS = (None, "DirectRunner", "directrunner", "direct", "FnApiRunner")

# The Beam release whose guarded imports SKIPPED_BY_LOCAL_RUNS was checked against.
BEAM_CHECKED = "2.77.0"

# What `import apache_beam` loads for IOs and runners a local run never uses. Not listed:
# what a local run uses, or Beam imports unguarded (oauth2client.crypt: apitools imports it).
SKIPPED_BY_LOCAL_RUNS = (
    "bson",
    "pymongo",
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
    "google.cloud.bigquery",
    "google.cloud.bigquery_storage_v1",
    "google.cloud.dataflow",
)

# Beam's loggers that announce, at import, an optional package they did not find.
_ANNOUNCE_MISSING = ("apache_beam.io.mongodbio",)


@contextlib.contextmanager
def imports_skipped(names: tuple[str, ...]):
    """While in the block, importing any of `names` (or a module under it) raises ImportError
    (a `None` in sys.modules: docs.python.org/3/reference/import.html#the-module-cache).
    Names already imported are left alone; Beam's warning about MongoDB is muted."""
    added = [name for name in names if name not in sys.modules]
    muted = [logger for logger in map(logging.getLogger, _ANNOUNCE_MISSING) if not logger.disabled]
    for name in added:
        sys.modules[name] = None
    for logger in muted:
        logger.disabled = True
    try:
        yield
    finally:
        for logger in muted:
            logger.disabled = False
        for name in added:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def prepare(argv: list[str]) -> None:
    """Sets the CLI process up for the command line `argv` (without the program), before Beam loads."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    local = runner_named(argv) in LOCAL_RUNNERS  # Dataflow's runner needs its API client
    with imports_skipped(SKIPPED_BY_LOCAL_RUNS if local else ()):
        import apache_beam  # noqa: F401 - the bulk of the start-up


def before_exit() -> None:
    """Right before the CLI process exits: what is alive leaves the collector's last walk."""
    gc.freeze()


def runner_named(argv: list[str]) -> str | None:
    """The value of the last `--runner` flag in `argv` (as Beam's argparse), or None."""
    runner = None
    for i, arg in enumerate(argv):
        if arg == "--runner" and i + 1 < len(argv):
            runner = argv[i + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner
