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
