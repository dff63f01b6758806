"""The local runner's defaults (convert, verify --beam): the in-process FnApiRunner and its
writer processes."""

from __future__ import annotations

import contextlib

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.cli.startup import LOCAL_RUNNERS
from transforms.writing.processes import default_processes, prestart, set_malloc_thresholds, stop_prestarted

# The local runner. Beam's "DirectRunner" first tries to download the Prism binary and
# falls back to this one; naming it directly skips that.
LOCAL_RUNNER = "FnApiRunner"


# glibc malloc in the runner's process: blocks from this size up get their own mapping, given
# back whole when freed. The runner's encoded batches (~100-200 KB) left holes in the heap
# that grew with the image count (benchmarks/README.md).
RUNNER_MMAP_THRESHOLD = 64 * 1024


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def local_defaults(options: PipelineOptions, argv: list[str]) -> None:
    """Local runs use the in-process runner, one Beam worker, and every core unless told otherwise.

    The cores are WriteShardFn's worker processes (`--write_processes`): the per-image work
    holds the GIL. One `in_memory` worker avoids `multi_threading`'s gRPC data plane (a
    per-element cost, a rare decode error in Beam 2.77; benchmarks/README.md). In
    `multi_processing` mode the DoFns already run in worker processes: shards are written there.
    """
    standard = options.view_as(StandardOptions)
    if standard.runner not in LOCAL_RUNNERS:
        return
    standard.runner = LOCAL_RUNNER
    set_malloc_thresholds(RUNNER_MMAP_THRESHOLD)
    direct = options.view_as(DirectOptions)
    if not _given(argv, "--direct_num_workers"):
        direct.direct_num_workers = 1
    if not _given(argv, "--direct_running_mode"):
        direct.direct_running_mode = "in_memory" if direct.direct_num_workers == 1 else "multi_threading"
    convert = options.view_as(ConvertOptions)
    in_runner_process = direct.direct_running_mode != "multi_processing"
    if not convert.write_processes:
        convert.write_processes = default_processes() if in_runner_process else 1
    global _writers
    _writers = (convert.write_processes, convert.read_threads) if in_runner_process else None


# Writer processes of the local run that local_defaults configured last: (processes,
# --read_threads), forked by `writers_prestarted` before the run; None: nothing to fork.
_writers: tuple[int, int] | None = None


@contextlib.contextmanager
def writers_prestarted():
    """Around a local run: local_defaults' writer processes forked on entry, before the runner
    holds any metadata they would inherit (transforms/writing/processes.py `prestart`); any
    not taken by WriteShardFn stopped on exit. Enter it in the thread that waits for the run.
    """
    global _writers
    writers, _writers = _writers, None
    try:
        if writers is not None and writers[0] > 1:
            prestart(*writers)
        yield
    finally:
        stop_prestarted()


def in_process(options: PipelineOptions) -> bool:
    """True when the DoFns run in this process (the local runner, not multi_processing)."""
    return (
        options.view_as(StandardOptions).runner == LOCAL_RUNNER
        and options.view_as(DirectOptions).direct_running_mode != "multi_processing"
    )
