"""Whole shards written in parallel forked worker processes (local runs, `--write_processes`).

Per-image work holds the GIL, so only processes use a second core. A worker gets a ShardTask
(paths and labels, pickled as columns), writes the temp shard itself (shard.write_shard) and
returns a small ShardOutcome: image bytes never cross a process boundary. Shards go out largest
first; the last few (local, uncompressed) in parts appended in order afterwards, so that every
process stays busy to the end (`split_shards`, `join_parts`).

Workers are forked (a spawned one re-imports Beam, ~1.3 s of CPU), which is safe although the
parent runs threads: a worker opens its own files and thread pool, and Beam's GCS filesystem
makes a new client per call. They die with the thread that forked them (PR_SET_PDEATHSIG), so
a killed run leaves no worker writing. Each adds its written images and bytes to its own slot
of a shared array, without a lock; the main process sums the slots while it waits.

Memory (nothing a worker holds follows the dataset): local runs fork the workers before the
run (`prestart`), so they share none of the runner's growing buffers; a worker gets at most
PART_RECORDS records at a time where a shard can be split.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import gc
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from transforms.progress import Progress
from transforms.records import ClassIndex, ShardTask
from transforms.writing.files import delete_paths
from transforms.writing.index import write_index
from transforms.writing.shard import ShardJob, ShardOutcome, write_shard

# How often (seconds) the main process forwards the workers' counts to Progress while it waits.
POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's <malloc.h>

# glibc malloc in a worker: an image read whole (up to this size) comes from the heap.
WORKER_MMAP_THRESHOLD = 4 * 2**20

# Records a worker gets at once where a shard can be split: a 128 MB shard of tiny images may
# hold ~150,000 records without --max_records_per_shard.
PART_RECORDS = 10_000

# Objects of a bucket read ahead by a worker (its threads wait on the network, not the GIL).
REMOTE_READ_THREADS = 8


def set_malloc_thresholds(mmap_threshold: int) -> bool:
    """Fixes glibc malloc's mmap threshold (and the trim threshold at twice that) for this
    process and its later forks, which turns off glibc's adaptive threshold (it rises to the
    largest block freed, up to 32 MB). False where there is no glibc mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2 * mmap_threshold)
    )


def default_processes() -> int:
    """One worker per core this process may run on (Linux); elsewhere 1, since forking a
    process that runs threads is only safe where fork is the platform's own way."""
    return len(os.sched_getaffinity(0)) if sys.platform.startswith("linux") else 1


def dump_task(task: ShardTask) -> bytes:
    """`task` pickled for a worker as columns (ShardTask.__reduce__): no ImageRecord built."""
    return pickle.dumps(task, pickle.HIGHEST_PROTOCOL)


def split_shards(tasks: list[ShardTask], workers: int, most: int | None = None) -> list[list[ShardTask]]:
    """The order in which `workers` processes write `tasks`, each as a list of its parts.

    Largest shards first, so that the small ones fill in at the end; the last `workers` shards
    in `workers` parts each, so that no process idles while another writes a whole last shard
    alone; with `most`, no part holds more than `most` records.
    """
    ordered = sorted(tasks, key=lambda t: -sum(t.batch.sizes))
    plan = []
    for i, task in enumerate(ordered):
        n = len(task)
        parts = workers if i >= len(ordered) - workers else 1
        parts = max(1, min(n, max(parts, -(-n // most) if most else 1)))  # none empty
        plan.append(
            [task.part(n * k // parts, n * (k + 1) // parts) for k in range(parts)] if parts > 1 else [task]
        )
    return plan


def join_parts(parts: list[ShardOutcome], job: ShardJob) -> ShardOutcome:
    """One shard from the outcomes of its parts, in order: the part files appended to the first."""
    failures = tuple(f for p in parts for f in p.failures)
    sizes = tuple(s for p in parts for s in p.sizes)
    written = [p.result for p in parts if p.result is not None]
    if not written:
        return ShardOutcome(None, failures)
    first = written[0]
    with open(first.temp_path, "ab") as out:
        for part in written[1:]:
            with open(part.temp_path, "rb") as src:
                shutil.copyfileobj(src, out)
    delete_paths([p.temp_path for p in written[1:]])
    if job.write_index:
        write_index(first.temp_path, sizes)
    per_class: collections.Counter = collections.Counter()
    objects: collections.Counter = collections.Counter()
    for r in written:
        per_class.update(dict(r.written))
        objects.update(dict(r.objects))
    result = dataclasses.replace(
        first,
        records=sum(r.records for r in written),
        bytes=sum(r.bytes for r in written),
        formats=tuple(sorted({f for r in written for f in r.formats})),
        written=tuple(sorted(per_class.items())),
        objects=tuple(sorted(objects.items())),
    )
    return ShardOutcome(result, failures, sizes)


class ShardProcesses:
    """A pool of forked worker processes writing shards (see module docstring).

    Create it in the thread that waits for the results (the DoFn's), and close it there. It
    takes the workers `prestart` forked for (processes, threads) if any, else forks them.
    The class index reaches the workers by a file each reads once (prestarted workers were
    forked before it existed; pickled with every shard it would cost time per class).
    """

    def __init__(self, processes: int, threads: int = 0, progress: Progress | None = None):
        if processes < 1:
            raise ValueError("processes must be positive")
        self._progress, self._forwarded, self._processes = progress, (0, 0), processes
        self._index: tuple[ClassIndex, str] | None = None  # the class index and its file
        self._executor, self._counts = _take_prestarted(processes, threads) or _fork_pool(processes, threads)

    def write(self, tasks: list[ShardTask], class_index: ClassIndex, job: ShardJob) -> Iterator[ShardOutcome]:
        """Writes every task and yields each shard's outcome as soon as it is complete.

        Empties `tasks` and hands the parts over one at a time (at most 2 per worker in flight),
        each pickled as it goes (`dump_task`): the runner holds no pickle of the whole round.
        Raises whatever a worker raised (a bug: expected errors are Failures) and
        BrokenProcessPool if a worker died.
        """
        # A local uncompressed shard may be written in parts and joined (a TFRecord file is its
        # records one after the other; gzip members and bucket objects cannot be appended).
        splittable = job.compression == "none" and "://" not in job.temp_dir
        plan = split_shards(tasks, self._processes if splittable else 1, PART_RECORDS if splittable else None)
        tasks.clear()
        sizes = [len(parts) for parts in plan]
        queue = collections.deque(
            (i, k, part) for i, parts in enumerate(plan) for k, part in enumerate(parts)
        )
        del plan
        if self._index is None or self._index[0] is not class_index:
            self.close_index()
            fd, path = tempfile.mkstemp(prefix="img2tfrecord-classes-", suffix=".pickle")
            with os.fdopen(fd, "wb") as f:
                pickle.dump(class_index, f, pickle.HIGHEST_PROTOCOL)
            self._index = (class_index, path)
        which: dict[futures.Future, tuple[int, int]] = {}

        def hand_over() -> futures.Future:
            i, k, part = queue.popleft()
            args = (dump_task(part), self._index[1], job, sizes[i] == 1)
            future = self._executor.submit(_write_in_worker, *args)
            which[future] = (i, k)
            return future

        in_flight = 2 * self._processes
        pending = {hand_over() for _ in range(min(in_flight, len(queue)))}
        outcomes: list[list[ShardOutcome | None]] = [[None] * n for n in sizes]
        left = list(sizes)
        while pending:
            done, pending = futures.wait(pending, timeout=POLL_SECONDS, return_when=futures.FIRST_COMPLETED)
            self._forward()
            while queue and len(pending) < in_flight:
                pending.add(hand_over())
            for future in done:  # in any order: FinalizeFn sorts shards and failures
                i, k = which.pop(future)
                outcomes[i][k] = future.result()
                left[i] -= 1
                if not left[i]:
                    yield join_parts(outcomes[i], job) if sizes[i] > 1 else outcomes[i][0]
                    outcomes[i] = []

    def close_index(self) -> None:
        if self._index is not None:
            with contextlib.suppress(OSError):
                os.remove(self._index[1])
            self._index = None

    def close(self, cancel: bool = False) -> None:
        """Stops the workers: after their current shard if `cancel`, else after all submitted ones."""
        self._executor.shutdown(wait=not cancel, cancel_futures=cancel)
        self._forward()
        self.close_index()

    def _forward(self) -> None:
        if self._progress is None:
            return
        counts = self._counts.slots[:]
        written, nbytes = sum(counts[0::2]), sum(counts[1::2])
        if (written, nbytes) != self._forwarded:
            self._progress.add(written=written - self._forwarded[0], nbytes=nbytes - self._forwarded[1])
            self._forwarded = (written, nbytes)


@dataclasses.dataclass
class _Counts:
    """Images and bytes written by the workers of one pool: a slot of two counts per worker,
    taken at its start (a fork pool forks all its workers at once and never replaces one)."""

    slots: object  # RawArray: images, bytes of worker 0, then 1, ...
    taken: object  # Value: slots handed out


def _fork_pool(processes: int, threads: int) -> tuple[ProcessPoolExecutor, _Counts]:
    """`processes` workers forked now, and the counts they add to."""
    context = multiprocessing.get_context("fork")
    counts = _Counts(context.RawArray("q", 2 * processes), context.Value("i", 0))
    executor = ProcessPoolExecutor(
        processes, mp_context=context, initializer=_start_worker, initargs=(counts, threads, os.getpid())
    )
    executor.submit(int).result()  # a fork pool forks all of its workers at its first submit: now
    return executor, counts


# Worker pools forked by `prestart` and not yet taken: (processes, threads) -> (executor, counts).
_PRESTARTED: dict[tuple[int, int], tuple[ProcessPoolExecutor, _Counts]] = {}
_PRESTARTED_LOCK = threading.Lock()  # taken by the thread that runs the bundle


def prestart(processes: int, threads: int = 0) -> None:
    """Forks the worker processes now, for the next ShardProcesses(processes, threads) to take.

    A worker forked once the runner holds the run's metadata shares those pages copy-on-write
    and ends up copying every page either process writes (~45 MB a writer at 100,000 tiny
    images). Call it in the thread that stays alive for the whole run (the workers die with
    it), and `stop_prestarted` after the run.
    """
    if processes < 1:
        raise ValueError("processes must be positive")
    pool = _fork_pool(processes, threads)
    with _PRESTARTED_LOCK:
        old = _PRESTARTED.pop((processes, threads), None)
        _PRESTARTED[(processes, threads)] = pool
    if old is not None:
        old[0].shutdown(wait=True, cancel_futures=True)


def _take_prestarted(processes: int, threads: int) -> tuple[ProcessPoolExecutor, _Counts] | None:
    with _PRESTARTED_LOCK:
        return _PRESTARTED.pop((processes, threads), None)


def stop_prestarted() -> None:
    """Stops the workers `prestart` forked that no ShardProcesses took (e.g. the run failed before)."""
    with _PRESTARTED_LOCK:
        pools = list(_PRESTARTED.values())
        _PRESTARTED.clear()
    for executor, _ in pools:
        executor.shutdown(wait=True, cancel_futures=True)


# --- in the worker process -------------------------------------------------------------------

_slots = None  # the pool's shared array of (images, bytes) slots
_slot = 0  # where this worker's slot starts in it
_threads = 0  # --read_threads
_pool: ThreadPoolExecutor | None = None  # read-ahead threads of this worker, made when needed
_class_index: tuple[str, ClassIndex] | None = None  # (the index file, the index read from it)


def _start_worker(counts: _Counts, threads: int, parent_pid: int) -> None:
    """Worker set-up: die with the parent, take a counter slot, keep the thread setting."""
    global _slots, _slot, _threads
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # What was inherited (the runner's buffers) leaves the collector's lists: its passes would
    # otherwise write to every inherited object and copy its page into this process.
    gc.freeze()
    set_malloc_thresholds(WORKER_MMAP_THRESHOLD)
    with counts.taken.get_lock():
        _slot, counts.taken.value = 2 * counts.taken.value, counts.taken.value + 1
    _slots, _threads = counts.slots, threads


def _count_written(nbytes: int) -> None:
    """Adds an image to this worker's slot: no lock, the slot has no other writer."""
    _slots[_slot] += 1
    _slots[_slot + 1] += nbytes


def _write_in_worker(pickled_task: bytes, index_file: str, job: ShardJob, whole: bool) -> ShardOutcome:
    """Writes a shard (or part), a pickled ShardTask, in this worker.

    With `--read_threads` 0 the worker itself checks, encodes and writes each image (a thread
    hand-over per image would cost more than it saves) while the next local files are opened
    ahead (shard.OpenAhead), or REMOTE_READ_THREADS threads read the next objects of a bucket.
    1: nothing is read ahead; more: that many threads read, check and encode ahead.
    """
    global _pool, _class_index
    task: ShardTask = pickle.loads(pickled_task)
    del pickled_task
    if _class_index is None or _class_index[0] != index_file:  # read once per worker and index
        with open(index_file, "rb") as f:
            _class_index = (index_file, pickle.load(f))
    remote = any("://" in path for path in task.batch.paths)
    threads = (REMOTE_READ_THREADS if remote else 1) if _threads == 0 else _threads
    if threads > 1 and _pool is None:
        _pool = ThreadPoolExecutor(threads, thread_name_prefix="read-ahead")
    pool = _pool if threads > 1 else None
    reads_only, hint_ahead = _threads == 0 and remote, 8 if _threads == 0 and not remote else 0
    return write_shard(task, _class_index[1], job, pool, _count_written, whole, reads_only, hint_ahead)
