"""Whole shards written in parallel worker processes (local runs, `--write_processes`).

Almost all per-image work (read, check, encode, framing) holds the GIL, so threads cannot
use a second core; processes that each write whole shards can. A worker gets a ShardTask
(paths and labels: small), reads, checks and encodes the images and writes the temp shard
itself (`transforms.writing.shard.write_shard`); only the ShardOutcome (temp path, counts,
failures) comes back. Image bytes never cross a process boundary. Shards go out largest
first, and the last few (local, uncompressed) in parts that are appended in order
afterwards, so that every process stays busy to the end (`split_shards`, `join_parts`).

Workers are forked: they start in milliseconds with every module already imported (a
spawned or forkserver worker re-imports the main module, i.e. Beam, ~1.3 s of CPU each).
Forking a process that runs threads is safe here because a worker uses nothing that
another thread of the parent may hold: it opens its own files, makes its own thread pool,
and Beam's GCS filesystem makes a new client (and HTTP session) for every call. Workers
die with the thread that forked them (PR_SET_PDEATHSIG on Linux), so a killed run leaves
no worker writing into its temp folder.

Progress: every worker adds each written image to its own slot of a shared array (images,
bytes), without a lock: a slot has one writer, and the main process, which sums the slots
while it waits and forwards the total to the run's Progress, only reads them (a slot read
while its worker updates it gives the image count one image ahead of the bytes, caught up
at the next read). A lock taken per image cost each image a semaphore round trip, and the
two workers contended for it.

Memory (what a worker holds does not follow the dataset): on local runs the workers are
forked before the run (`prestart`), so they share none of the runner's growing buffers; a
worker gets at most PART_RECORDS records at a time where a shard can be split (a shard of
tiny images holds up to --max_records_per_shard records: 10,000 by default, ~150,000 at
128 MB without that cap); parts are pickled as they are
handed over, as columns (`dump_task`). Per image, a worker holds the columns of its
current part only (write_shard builds each record object as it writes that image); the
runner, the columns of the shards that Beam hands WriteShardFn (a round of them).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from transforms.progress import Progress
from transforms.records import ClassIndex, ShardTask
from transforms.writing.shard import ShardJob, ShardOutcome, can_split, join_parts, split_shards, write_shard

# How often (seconds) the main process forwards the workers' counts to Progress while it waits.
POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's <malloc.h>

# glibc malloc in a worker: blocks up to this size (an image read whole) come from the heap,
# and up to twice that stays free at its top between images (as glibc's own adaptive
# thresholds would settle after the first large image, fixed here since the runner fixes
# its own lower: see set_malloc_thresholds).
WORKER_MMAP_THRESHOLD = 4 * 2**20


def set_malloc_thresholds(mmap_threshold: int, trim_threshold: int | None = None) -> bool:
    """Sets glibc malloc's mmap (and trim) thresholds for this process (and its later forks).

    A block of at least `mmap_threshold` bytes gets its own mapping, given back to the
    kernel when freed; smaller ones come from the heap, whose free top is trimmed above
    `trim_threshold` (default: twice `mmap_threshold`). Fixing them turns off glibc's
    adaptive threshold, which otherwise rises to the largest block freed so far (up to
    32 MB). Returns False where there is no glibc mallopt (other platforms, musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    trim = 2 * mmap_threshold if trim_threshold is None else trim_threshold
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim))


# Records a worker gets at once, where a shard can be written in parts and joined: a shard
# of tiny images may hold more (~150,000 at 128 MB of 633-byte JPEGs, with a larger or no
# --max_records_per_shard), and a worker holding its
# part as objects (~500 bytes a record) would follow the shard's record count.
PART_RECORDS = 10_000


def cut_parts(parts: list[ShardTask], most: int) -> list[ShardTask]:
    """The parts of one shard (in order), each cut further into runs of at most `most` records.

    Appended in order (`join_parts`) they are the shard written whole, byte for byte.
    """
    if most < 1:
        raise ValueError("most must be positive")
    cut: list[ShardTask] = []
    for part in parts:
        n = len(part)
        if n <= most:
            cut.append(part)
            continue
        cut.extend(part.part(a, a + most) for a in range(0, n, most))
    return cut


def dump_task(task: ShardTask) -> bytes:
    """`task` pickled for a worker: its split, index and columns (ShardTask.__reduce__).

    Pickle's memo writes a split name or label tuple shared by many records once, and the
    worker's copy shares it again; no ImageRecord is built on either side.
    """
    return pickle.dumps(task, pickle.HIGHEST_PROTOCOL)


def default_processes() -> int:
    """Worker processes when not configured: one per core this process may run on (Linux).

    Elsewhere 1 (shards written in the runner's process): forking a process that runs
    threads is only safe where fork is the platform's own way to start processes.
    """
    if not sys.platform.startswith("linux"):
        return 1
    return len(os.sched_getaffinity(0))


class ShardProcesses:
    """A pool of forked worker processes writing shards (see module docstring).

    Create it in the thread that waits for the results (the DoFn's), and close it there.
    """

    def __init__(
        self,
        processes: int,
        threads: int = 0,
        progress: Progress | None = None,
        class_index: ClassIndex | None = None,
        part_records: int | None = None,
    ):
        """Takes the workers `prestart` forked for (processes, threads) if any, else forks them.

        Args:
          part_records: at most this many records go to a worker at once (PART_RECORDS),
            where shards can be written in parts (`can_split`).
          class_index: handed to the workers once each (one name per class: pickled with
            every shard, it would cost each shard time in proportion to the class count): by
            the fork, or, to workers forked before it existed, by a file each reads once.
        """
        if processes < 1:
            raise ValueError("processes must be positive")
        self._progress = progress
        self._forwarded = (0, 0)
        self._processes = processes
        self._part_records = part_records or PART_RECORDS
        self._index_file: _IndexFile | None = None
        started = _take_prestarted(processes, threads)
        if started is not None:
            self._executor, self._counts = started
            self._class_index = None
            return
        self._executor, self._counts = _fork_pool(processes, threads, class_index)
        self._class_index = class_index

    def write(self, tasks: list[ShardTask], class_index: ClassIndex, job: ShardJob) -> Iterator[ShardOutcome]:
        """Writes every task and yields each shard's outcome as soon as it is complete.

        Takes the tasks out of `tasks` (the list is left empty) and hands them to the
        workers a part at a time, at most 2 parts per worker in flight, each pickled when it
        is handed over (`dump_task`): the runner holds no pickle of the whole round, and the
        records of a round can be freed as its parts go out. Local uncompressed shards at
        the end of the queue are written in parts and joined (see `split_shards`), and any
        part above PART_RECORDS records is cut further (`cut_parts`). Raises whatever a
        worker raised (a bug: expected errors are Failures) and BrokenProcessPool if a
        worker died.
        """
        splittable = can_split(job)
        plan = split_shards(tasks, self._processes if splittable else 1)
        tasks.clear()
        if splittable:
            plan = [cut_parts(parts, self._part_records) for parts in plan]
        sizes = [len(parts) for parts in plan]
        queue = collections.deque(
            (i, k, part) for i, parts in enumerate(plan) for k, part in enumerate(parts)
        )
        del plan
        which: dict[futures.Future, tuple[int, int]] = {}

        def hand_over() -> futures.Future:
            i, k, part = queue.popleft()
            sent = self._index_to_send(class_index)
            future = self._executor.submit(_write_in_worker, dump_task(part), sent, job, sizes[i] == 1)
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

    def _index_to_send(self, class_index: ClassIndex) -> ClassIndex | _IndexFile | None:
        """None: the workers have it from the fork; else the index itself or its file."""
        if class_index is self._class_index:
            return None
        if self._index_file is None or self._index_file.index is not class_index:
            if self._index_file is not None:
                self._index_file.remove()
            self._index_file = _IndexFile.write(class_index)
        return self._index_file

    def close(self, cancel: bool = False) -> None:
        """Stops the workers: after their current shard if `cancel`, else after all submitted ones."""
        self._executor.shutdown(wait=not cancel, cancel_futures=cancel)
        self._forward()
        if self._index_file is not None:
            self._index_file.remove()
            self._index_file = None

    def _forward(self) -> None:
        if self._progress is None:
            return
        written, nbytes = self._counts.total()
        if (written, nbytes) != self._forwarded:
            self._progress.add(written=written - self._forwarded[0], nbytes=nbytes - self._forwarded[1])
            self._forwarded = (written, nbytes)


class _IndexFile:
    """A ClassIndex pickled to a temporary file, for workers that were forked before it existed.

    Pickled with a task, only the path travels; each worker reads the file once (the first
    task that names it) and keeps the index for the following ones.
    """

    def __init__(self, path: str, index: ClassIndex):
        self.path, self.index = path, index

    @classmethod
    def write(cls, index: ClassIndex) -> _IndexFile:
        fd, path = tempfile.mkstemp(prefix="img2tfrecord-classes-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(index, f, pickle.HIGHEST_PROTOCOL)
        return cls(path, index)

    def __getstate__(self) -> str:
        return self.path

    def __setstate__(self, path: str) -> None:
        self.path, self.index = path, None

    def load(self) -> ClassIndex:
        with open(self.path, "rb") as f:
            return pickle.load(f)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.path)


class WrittenCounts:
    """Images and bytes written by the workers of one pool: one slot of two counts per worker.

    Each worker takes a slot when it starts (`take_slot`) and adds to it alone, without a
    lock (`_count_written`); `total` sums the slots for the main process. A fork pool forks
    all of its workers at its first submit and never replaces one (a worker that dies breaks
    the pool), so `processes` slots are enough.
    """

    def __init__(self, context, processes: int):
        self._slots = context.RawArray("q", 2 * processes)  # images, bytes of worker 0, then 1, ...
        self._taken = context.Value("i", 0)  # slots handed out (under its own lock, once a worker)

    def take_slot(self) -> tuple[object, int]:
        """(the shared array, this worker's offset in it); for a worker, at its start."""
        with self._taken.get_lock():
            slot = self._taken.value
            self._taken.value += 1
        if 2 * slot >= len(self._slots):
            raise RuntimeError(
                f"worker {slot + 1} of a pool of {len(self._slots) // 2}: no counter slot left"
            )
        return self._slots, 2 * slot

    def total(self) -> tuple[int, int]:
        """(images, bytes) written by every worker so far."""
        counts = self._slots[:]
        return sum(counts[0::2]), sum(counts[1::2])


def _fork_pool(
    processes: int, threads: int, class_index: ClassIndex | None = None
) -> tuple[ProcessPoolExecutor, WrittenCounts]:
    """`processes` workers forked now, and the counts they add to."""
    context = multiprocessing.get_context("fork")
    counts = WrittenCounts(context, processes)
    executor = ProcessPoolExecutor(
        processes,
        mp_context=context,
        initializer=_start_worker,
        initargs=(counts, threads, os.getpid(), class_index),
    )
    # A fork-context pool forks all of its workers at its first submit: now, not at first use.
    executor.submit(int).result()
    return executor, counts


# Worker pools forked by `prestart` and not yet taken by a ShardProcesses:
# (processes, threads) -> (executor, the workers' counts).
_PRESTARTED: dict[tuple[int, int], tuple[ProcessPoolExecutor, WrittenCounts]] = {}
_PRESTARTED_LOCK = threading.Lock()


def prestart(processes: int, threads: int = 0) -> None:
    """Forks the worker processes now, for the next ShardProcesses(processes, threads) to take.

    A worker forked by the runner once it holds the run's metadata (its buffers grow with
    the image count) shares those pages copy-on-write, and every page that either process
    later writes or frees becomes the worker's own copy: at 100,000 tiny images each writer
    ended up with ~45 MB of the runner's pages. Forked before the run, a worker starts from
    the imported modules and the pipeline graph only. Call it in the thread that stays
    alive for the whole run (the workers die with it), and `stop_prestarted` after the run.
    The class index, made later, reaches these workers by a file (`_IndexFile`), read once
    by each.
    """
    if processes < 1:
        raise ValueError("processes must be positive")
    executor, counts = _fork_pool(processes, threads)
    with _PRESTARTED_LOCK:
        old = _PRESTARTED.pop((processes, threads), None)
        _PRESTARTED[(processes, threads)] = (executor, counts)
    if old is not None:
        old[0].shutdown(wait=True, cancel_futures=True)


def _take_prestarted(processes: int, threads: int) -> tuple[ProcessPoolExecutor, WrittenCounts] | None:
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

# Objects of a bucket read ahead by a worker (its threads wait on the network, not the GIL).
REMOTE_READ_THREADS = 8

_counts = None  # the pool's shared array of (images, bytes) slots
_slot = 0  # where this worker's slot starts in it
_threads = 0  # --read_threads
_pool: ThreadPoolExecutor | None = None  # read-ahead threads of this worker, made when needed
_class_index: ClassIndex | None = None  # the pool's class index, inherited at the fork
_class_index_path: str | None = None  # or read from this _IndexFile


def _start_worker(
    counts: WrittenCounts, threads: int, parent_pid: int, class_index: ClassIndex | None = None
) -> None:
    """Worker set-up: die with the parent, take a counter slot, keep the thread setting and class index."""
    global _counts, _slot, _threads, _class_index
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # Everything inherited from the parent (the runner's buffers of metadata, which grow with
    # the dataset) leaves the collector's lists: its passes would otherwise write to every
    # inherited object and copy its page into this process. Cheap: the lists are merged whole.
    gc.freeze()
    set_malloc_thresholds(WORKER_MMAP_THRESHOLD)
    (_counts, _slot), _threads, _class_index = counts.take_slot(), threads, class_index


def _count_written(nbytes: int) -> None:
    """Adds an image to this worker's slot: no lock, the slot has no other writer."""
    _counts[_slot] += 1
    _counts[_slot + 1] += nbytes


def _write_in_worker(
    pickled_task: bytes, class_index: ClassIndex | _IndexFile | None, job: ShardJob, whole: bool
) -> ShardOutcome:
    """Writes a shard (or part), a pickled ShardTask, in this worker.

    With `--read_threads` 0 the worker itself checks, encodes and writes each image (all
    of it holds the GIL, and a thread hand-over per image would cost more than it saves)
    while the kernel is asked to read the next local files ahead (`posix_fadvise`), or
    REMOTE_READ_THREADS threads read the next objects of a bucket. 1: nothing is read
    ahead; more: that many threads read, check and encode ahead.
    """
    global _pool, _class_index, _class_index_path
    task: ShardTask = pickle.loads(pickled_task)
    del pickled_task
    if isinstance(class_index, _IndexFile):  # read once per worker (and per index)
        if class_index.path != _class_index_path:
            _class_index, _class_index_path = class_index.load(), class_index.path
        class_index = None
    if class_index is None:  # the pool's own: inherited at the fork, or read from its file
        class_index = _class_index
    remote = any("://" in path for path in task.batch.paths)
    threads = (REMOTE_READ_THREADS if remote else 1) if _threads == 0 else _threads
    if threads > 1 and _pool is None:
        _pool = ThreadPoolExecutor(threads, thread_name_prefix="read-ahead")
    pool = _pool if threads > 1 else None
    reads_only, hint_ahead = _threads == 0 and remote, 8 if _threads == 0 and not remote else 0
    return write_shard(task, class_index, job, pool, _count_written, whole, reads_only, hint_ahead)
