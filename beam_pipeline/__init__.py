"""img2tfrecord: options, pipeline assembly and entry points."""

import contextlib
import gc
import logging
import os
import sys

from beam_pipeline.cli.runners import LOCAL_RUNNERS, runner_named  # argv only: no Beam


def started_as_cli(argv: list[str]) -> bool:
    """True if `argv` (the interpreter's own, sys.orig_argv) runs `img2tfrecord` or
    `python -m beam_pipeline`."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None) == "beam_pipeline"
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):  # the script
            return os.path.basename(arg) == "img2tfrecord"
        elif arg == "-c":
            return False
    return False


# Beam imports numpy, whose OpenBLAS starts a thread pool as big as the machine at import
# (0.03-0.1 s of CPU on 2 cores at every start, by load). The CLI does no linear algebra: one thread.
# Only there (not where a program imports this package), and never against the user's setting.
if "numpy" not in sys.modules and started_as_cli(sys.orig_argv):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def without_grpc_fork_handlers(environ=os.environ) -> None:
    """Turns gRPC's fork support off (GRPC_ENABLE_FORK_SUPPORT=false) unless already set.

    With it on (grpcio's default), a process whose gRPC has started (Beam's portable and
    multi-process runners, Google's clients) restarts gRPC's poller thread in every child it
    forks, before the child execs. `subprocess` then closes the child's descriptors, the
    poller's among them, and gRPC aborts the child (SIGABRT) before it runs: measured here,
    3-12 children in 1,000 (grpc/grpc#43055). Beam's own tests turn it off for the same
    reason. Nothing of ours uses a gRPC channel across a fork. gRPC reads the setting when
    it is imported: call this first.
    """
    environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


# The CLI: before Beam imports gRPC (the local runner's multi_processing mode starts its
# workers with `subprocess` once its gRPC servers run).
if "grpc" not in sys.modules and started_as_cli(sys.orig_argv):
    without_grpc_fork_handlers()

# What `import apache_beam` loads for IOs and runners that a local run never uses: MongoDB's
# client (apache_beam.io.mongodbio), Pub/Sub and BigQuery with its Storage API
# (apache_beam.io.gcp), Parquet's pyarrow (apache_beam.io.parquetio, apache_beam.typehints) and
# the Dataflow API client (apache_beam.runners.dataflow): ~0.2 s of CPU at every start
# (benchmarks/README.md). Beam imports each of them under `try: ... except ImportError`, and
# the IO or runner that needs it then reports itself unavailable. Not listed: anything a
# local run uses, or that Beam imports without such a guard or next to something it uses
# (oauth2client.crypt, whose pyasn1 and rsa cost ~0.1 s: apitools imports it unguarded, and
# apache_beam.utils.retry would then lose its HttpError and GoogleAPICallError checks).
SKIPPED_BY_LOCAL_RUNS = (
    "bson",
    "pymongo",
    "google.cloud.pubsub",
    "google.cloud.pubsub_v1",
    "google.cloud.bigquery",
    "google.cloud.bigquery_storage_v1",
    "google.cloud.dataflow",
    "pyarrow",
)

# Beam's loggers that announce, at import, an optional package they did not find.
_ANNOUNCE_MISSING = ("apache_beam.io.mongodbio",)


@contextlib.contextmanager
def imports_skipped(names: tuple[str, ...]):
    """While in the block, importing any of `names` (or a module under it) raises ImportError,
    as if it were not installed; afterwards each imports as usual.

    A `None` in sys.modules is Python's own way to make an import fail
    (https://docs.python.org/3/reference/import.html#the-module-cache). Names already
    imported are left alone. Beam's warning that it found no MongoDB driver is muted for
    the block.
    """
    added = [name for name in names if name not in sys.modules]
    loggers = [logging.getLogger(name) for name in _ANNOUNCE_MISSING]
    muted = [logger for logger in loggers if not logger.disabled]
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


def skips_unused_imports(argv: list[str]) -> bool:
    """True if the process runs the CLI (`argv`: sys.orig_argv) with the local runner: Beam's
    import may then leave out SKIPPED_BY_LOCAL_RUNS. A program that imports this package, and
    a run on another runner (Dataflow's needs its API client), import Beam whole."""
    return started_as_cli(argv) and runner_named(argv) in LOCAL_RUNNERS


_skipped = SKIPPED_BY_LOCAL_RUNS if skips_unused_imports(sys.orig_argv) else ()

# Importing Beam creates about a million long-lived objects and almost no garbage: the
# collector's passes over them during and after the import are pure cost (about 0.15 s of
# CPU at every start). Collection pauses for the import, and what it created is frozen
# (kept out of later passes; gc.freeze).
_collecting = gc.isenabled()
gc.disable()
try:
    with imports_skipped(_skipped):
        import apache_beam  # noqa: F401 - the bulk of the start-up

    from beam_pipeline.readers.dataset import load_dataset, parse_spec
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

__all__ = ["load_dataset", "parse_spec"]
