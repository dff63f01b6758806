"""The CLI process's set-up before Beam is imported: the one place that changes process-wide state.

Called only by the console entry (beam_pipeline/__main__.py) before it imports Beam: importing
the package, or running `main.run()` from a program, changes none of it
(tests/cli/test_startup.py). Each item is a tested correctness fix or a start-up gain measured
outside the rounds' spread (CONTRIBUTING.md, benchmarks/README.md "Start-up"):

- `GRPC_ENABLE_FORK_SUPPORT=false` (correctness): with it on (grpcio's default), a process whose
  gRPC has started restarts gRPC's poller in every child it forks before the child execs;
  `subprocess` then closes the poller's descriptors and gRPC aborts the child (SIGABRT): 3-12
  children in 1,000 here (grpc/grpc#43055). Beam's own tests turn it off too.
- The interpreter's last collection skipped (`before_exit`): it would walk the ~1 million
  objects of Beam's modules and the graph once more (~0.3-0.4 s of CPU a run).
- Beam imported without the client libraries of IOs and runners a local run never uses
  (SKIPPED_BY_LOCAL_RUNS): ~0.25 s of CPU and ~45-60 MB of RSS less at every start. Beam
  imports each under `try: ... except ImportError` (checked against BEAM_CHECKED: a Beam
  upgrade fails tests/cli/test_startup.py until it is checked again); they import as usual
  afterwards.
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

# What `import apache_beam` loads for IOs and runners that a local run never uses: MongoDB's
# client, Pub/Sub, BigQuery with its Storage API and the Dataflow API client. Not listed:
# anything a local run uses (pyarrow), or that Beam imports unguarded or next to something it
# uses (oauth2client.crypt: apitools imports it, and apache_beam.utils.retry's HttpError checks).
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
    """While in the block, importing any of `names` (or a module under it) raises ImportError:
    a `None` in sys.modules is Python's own way to make an import fail
    (https://docs.python.org/3/reference/import.html#the-module-cache). Names already imported
    are left alone; Beam's warning that it found no MongoDB driver is muted."""
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
    """Right before the CLI process exits: what is alive leaves the collector (gc.freeze), so
    the interpreter's last collection does not walk it."""
    gc.freeze()


def runner_named(argv: list[str]) -> str | None:
    """The value of the last `--runner` flag in `argv` (Beam's argparse keeps the last), or None,
    read before Beam is imported."""
    runner = None
    for i, arg in enumerate(argv):
        if arg == "--runner" and i + 1 < len(argv):
            runner = argv[i + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner
