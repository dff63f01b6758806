"""img2tfrecord: options, pipeline assembly and entry points."""

import gc
import os
import sys


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

# Importing Beam creates about a million long-lived objects and almost no garbage: the
# collector's passes over them during and after the import are pure cost (about 0.15 s of
# CPU at every start). Collection pauses for the import, and what it created is frozen
# (kept out of later passes; gc.freeze).
_collecting = gc.isenabled()
gc.disable()
try:
    import apache_beam  # noqa: F401 - the bulk of the start-up

    from beam_pipeline.readers.dataset import load_dataset, parse_spec
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

__all__ = ["load_dataset", "parse_spec"]
