"""WriteShards: each ShardTask written whole, in plan order, into the run's temp folder by
WriteShardFn's own thread or, on local runs, by forked worker processes (processes.py); only a
small ShardResult comes back. transforms/output/beam.py publishes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.encoding.encoder import EncodeSettings
from transforms.failures import FAILED
from transforms.images.prefetch import default_threads
from transforms.images.read import read_bytes
from transforms.progress import Progress, lookup
from transforms.records import ClassIndex, ShardTask
from transforms.retry import DEFAULT_RETRY, RetryPolicy
from transforms.writing.processes import ShardProcesses
from transforms.writing.shard import ShardJob, ShardOutcome, write_shard

# Records WriteShardFn holds before its worker processes write them (a round of shards).
HELD_RECORDS = 20_000


class WriteShardFn(beam.DoFn):
    """ShardTask -> ShardResult (with per-class written counts); FAILED per image as a tagged output.

    `processes` > 1 writes that many shards at once in forked worker processes (local runs),
    in rounds of up to HELD_RECORDS records of the bundle's shards; with 1 each shard is
    written in the DoFn's own thread (Dataflow: one SDK process per core already). `threads`:
    read-ahead threads per writer (0: one per core here; in a worker, processes.py decides).
    `progress_key` names the run's process-local Progress (transforms/progress.py), if any.
    `claim` (the output claim's Fence, transforms/output/fence.py) is kept alive while each
    bundle runs, for a job that keeps its claim (a remote runner); a bundle stops once it is lost.
    """

    def __init__(
        self,
        job: ShardJob,
        threads: int = 0,
        progress_key: str | None = None,
        processes: int = 1,
        claim: object | None = None,
    ):
        self._job, self._threads, self._progress_key = job, threads, progress_key
        self._processes, self._claim = processes, claim
        self._alive = None
        self._encoded = Metrics.counter(self.__class__, "images_encoded")
        self._failed = Metrics.counter(self.__class__, "images_failed")
        self._bytes = Metrics.counter(self.__class__, "bytes_written")
        self._pool: ThreadPoolExecutor | None = None
        self._workers: ShardProcesses | None = None
        self._progress: Progress | None = None

    def setup(self) -> None:
        self._progress = lookup(self._progress_key)
        threads = self._threads or default_threads()
        if self._processes == 1 and threads > 1:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="read-check")

    def teardown(self) -> None:
        self._keep_claim(False)
        self._stop_workers(cancel=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _keep_claim(self, start: bool) -> None:
        """Starts or stops beating the claim of a job that keeps it (see the class docstring)."""
        if self._alive is not None:
            self._alive, alive = None, self._alive
            alive.stop()
        if start and self._claim is not None and self._claim.job:
            self._alive = self._claim.keep_alive()  # checks the claim first

    def start_bundle(self) -> None:
        self._keep_claim(True)
        self._tasks: list[ShardTask] = []
        self._held = 0
        self._class_index: ClassIndex | None = None

    def process(self, task: ShardTask, class_index: ClassIndex) -> Iterable:
        if self._alive is not None:
            self._alive.check()
        if self._processes == 1:
            outcome = write_shard(task, class_index, self._job, self._pool, self._count_written)
            yield from self._outputs(outcome)
            return
        # In rounds (PlanShards emits every shard in one bundle locally): the records held
        # never follow the dataset's size, and each round shares its last shards out evenly.
        self._tasks.append(task)
        self._held += len(task)
        self._class_index = class_index
        if self._held >= HELD_RECORDS and len(self._tasks) > self._processes:
            yield from self._write_held()

    def finish_bundle(self) -> Iterable:
        try:
            for output in self._write_held():
                if isinstance(output, pvalue.TaggedOutput):
                    yield pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
                else:
                    yield GlobalWindows.windowed_value(output)
        finally:
            self._stop_workers(cancel=False)
            self._keep_claim(False)

    def _write_held(self) -> Iterable:
        """Writes the held tasks in the worker processes (made on first use in the bundle)."""
        if not self._tasks:
            return
        tasks, self._tasks, self._held = self._tasks, [], 0
        if self._workers is None:
            # The workers are forked by, and never outlive, the thread that runs the bundle.
            self._workers = ShardProcesses(self._processes, self._threads, self._progress)
        try:
            for outcome in self._workers.write(tasks, self._class_index, self._job):
                yield from self._outputs(outcome, in_worker=True)
        except BaseException:
            self._stop_workers(cancel=True)
            raise

    def _stop_workers(self, cancel: bool) -> None:
        if self._workers is not None:
            workers, self._workers = self._workers, None
            workers.close(cancel=cancel)

    def _count_written(self, nbytes: int) -> None:  # per image, so the Dataflow UI shows it live
        self._encoded.inc()
        self._bytes.inc(nbytes)
        if self._progress is not None:
            self._progress.add(written=1, nbytes=nbytes)

    def _outputs(self, outcome: ShardOutcome, in_worker: bool = False) -> Iterable:
        if in_worker and outcome.result is not None:  # counted per shard, not per image
            self._encoded.inc(outcome.result.records)
            self._bytes.inc(outcome.result.bytes)
        self._failed.inc(len(outcome.failures))
        for failure in outcome.failures:
            yield pvalue.TaggedOutput(FAILED, failure)
        if outcome.result is not None:
            yield outcome.result


class WriteShards(beam.PTransform):
    """Writes ShardTasks to temp shards. Outputs `.shards` (ShardResult) and `.failed` (Failure).

    `claim`: the output claim's Fence, beaten while shards are written (see WriteShardFn).
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        class_index: beam.PCollection[ClassIndex],
        compression: str = "none",
        settings: EncodeSettings = EncodeSettings(),
        write_index: bool = False,
        *,
        reader: Callable[[str], bytes] = read_bytes,
        retry: RetryPolicy = DEFAULT_RETRY,
        threads: int = 0,
        progress_key: str | None = None,
        processes: int = 1,
        claim: object | None = None,
    ):
        super().__init__()
        if threads < 0:
            raise ValueError("threads must be 0 (one per core) or positive")
        if processes < 1:
            raise ValueError("processes must be positive")
        # DALI/PyTorch index files exist for uncompressed shards only.
        job = ShardJob(temp_dir, compression, settings, write_index and compression == "none", reader, retry)
        self._fn = WriteShardFn(job, threads, progress_key, processes, claim)
        self._class_index = class_index

    def expand(self, tasks: beam.PCollection[ShardTask]) -> pvalue.DoOutputsTuple:
        return tasks | beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._class_index)).with_outputs(
            FAILED, main="shards"
        )
