"""Writing: shards (transforms/writing/shard.py), then failures and metadata.

Each ShardTask is written in its planned order by WriteShardFn's own thread or, on local
runs, by forked worker processes (one per core; see transforms/writing/processes.py), which
read, check and encode the shard's images and stream them into a temporary TFRecord file;
only a small ShardResult comes back. When
every shard is written, FinalizeFn stages failures.jsonl, labels.txt and summary.json next
to the temp shards and publishes everything by renaming it into place (temp then rename, as
`WriteToTFRecord` does), summary.json last; see transforms/writing/publish.py.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam import coders, pvalue
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordSink
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import images_in
from transforms.coders import SideDict
from transforms.encoding.encoder import EncodeSettings
from transforms.encoding.schema import schema_from_summary
from transforms.failures import FAILED, USER_ERROR_MARKER, Failure, diagnosis_of_kinds
from transforms.images.prefetch import default_threads
from transforms.images.read import DEFAULT_RETRY, RetryPolicy, read_bytes
from transforms.labels.beam import CountPerClassFn
from transforms.labels.rows import ORPHANS_FILE
from transforms.progress import Progress, lookup
from transforms.records import ClassIndex, FileBatch, RecordBatch, ShardResult, ShardTask
from transforms.writing.beam_failures import FailureCountsFn, WriteFailurePartsFn
from transforms.writing.failure_log import FailureCounts, merge_parts, part_of
from transforms.writing.files import _mkdirs
from transforms.writing.index import index_path
from transforms.writing.processes import ShardProcesses
from transforms.writing.publish import (
    ABORTED_FAILURES_FILE,
    FAILURES_FILE,
    LABELS_FILE,
    SUMMARY_FILE,
    delete_paths,
    existing_files,
    mark_aborted,
    publish,
    publish_failures_only,
    staging_dir,
    write_text,
)
from transforms.writing.shard import COMPRESSIONS, ShardJob, ShardOutcome, shard_suffix, write_shard
from transforms.writing.summary import accounting_error, build_summary, too_many_failures
from transforms.writing.tfds import tfds_name, write_reader_metadata

SHARD_TEMPLATE = "-SSSSS-of-NNNNN"


# Records WriteShardFn holds before its worker processes write them (a round of shards).
HELD_RECORDS = 20_000


def make_sink(output_dir: str, split: str, compression: str = "none") -> _TFRecordSink:
    """Beam's TFRecord sink for one split, whose writer ShardFile matches byte for byte (tested)."""
    return _TFRecordSink(
        file_path_prefix=FileSystems.join(output_dir, split),
        coder=coders.BytesCoder(),
        file_name_suffix=shard_suffix(compression),
        num_shards=0,
        shard_name_template=SHARD_TEMPLATE,
        compression_type=COMPRESSIONS[compression],
    )


class WriteShardFn(beam.DoFn):
    """ShardTask -> ShardResult (with per-class written counts); FAILED per image as a tagged output.

    `processes` > 1 writes that many shards at once in forked worker processes, in rounds
    of up to HELD_RECORDS records of the bundle's shards (transforms/writing/processes.py;
    local runs). With 1 each
    shard is written in the DoFn's own thread (Dataflow: one SDK process per core already). `threads` > 1 reads and
    checks the next images in a thread pool while the current one is written (order
    unchanged), per writer: the DoFn, or each worker process; 0 means one thread per core
    in the DoFn, and in a worker process what `_write_in_worker` says (no thread for local
    files, read-ahead threads for a bucket). `progress_key` names the run's process-local
    Progress (transforms/progress.py), if any.
    """

    def __init__(self, job: ShardJob, threads: int = 0, progress_key: str | None = None, processes: int = 1):
        self._job, self._threads, self._progress_key = job, threads, progress_key
        self._processes = processes
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
        self._stop_workers(cancel=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def start_bundle(self) -> None:
        self._tasks: list[ShardTask] = []
        self._held = 0
        self._class_index: ClassIndex | None = None

    def process(self, task: ShardTask, class_index: ClassIndex) -> Iterable:
        if self._processes == 1:
            outcome = write_shard(task, class_index, self._job, self._pool, self._count_written)
            yield from self._outputs(outcome)
            return
        # Written by the processes in rounds of up to HELD_RECORDS records (PlanShards emits
        # every shard in one bundle locally): each round shares its last shards out evenly,
        # and the records held never follow the dataset's size.
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

    def _write_held(self) -> Iterable:
        """Writes the held tasks in the worker processes (made on first use in the bundle)."""
        if not self._tasks:
            return
        tasks, self._tasks, self._held = self._tasks, [], 0
        if self._workers is None:
            # The workers are forked by, and never outlive, the thread that runs the bundle.
            self._workers = ShardProcesses(self._processes, self._threads, self._progress, self._class_index)
        try:
            for outcome in self._workers.write(tasks, self._class_index, self._job):
                self._count_shard(outcome)
                yield from self._outputs(outcome)
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

    def _count_shard(self, outcome: ShardOutcome) -> None:  # written in a worker: counted per shard
        if outcome.result is not None:
            self._encoded.inc(outcome.result.records)
            self._bytes.inc(outcome.result.bytes)

    def _outputs(self, outcome: ShardOutcome) -> Iterable:
        self._failed.inc(len(outcome.failures))
        for failure in outcome.failures:
            yield pvalue.TaggedOutput(FAILED, failure)
        if outcome.result is not None:
            yield outcome.result


class WriteShards(beam.PTransform):
    """Writes ShardTasks to temp shards. Outputs `.shards` (ShardResult) and `.failed` (Failure)."""

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
    ):
        super().__init__()
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}")
        if threads < 0:
            raise ValueError("threads must be 0 (one per core) or positive")
        if processes < 1:
            raise ValueError("processes must be positive")
        # DALI/PyTorch index files exist for uncompressed shards only.
        job = ShardJob(temp_dir, compression, settings, write_index and compression == "none", reader, retry)
        self._fn = WriteShardFn(job, threads, progress_key, processes)
        self._class_index = class_index

    def expand(self, tasks: beam.PCollection[ShardTask]) -> pvalue.DoOutputsTuple:
        return tasks | beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._class_index)).with_outputs(
            FAILED, main="shards"
        )


class WrittenPerClassFn(beam.CombineFn):
    """ShardResults -> {(split, class_key): images written}: bounded by splits x classes."""

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, shard: ShardResult) -> dict:
        for key, n in shard.written:
            acc[key] = acc.get(key, 0) + n
        return acc

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        merged: dict = {}
        for acc in accs:
            for key, n in acc.items():
                merged[key] = merged.get(key, 0) + n
        return merged

    def extract_output(self, acc: dict) -> dict:
        return acc


class FinalizeFn(beam.DoFn):
    """Runs once after every shard is written: stage the metadata, then publish it all.

    The shards and metadata are staged in the run's temp folder and renamed into place by
    `transforms.output.publish`, summary.json last. Above `max_failure_ratio` only the
    failures are published (`transforms.output.publish_failures_only`: a dataset already in
    the folder is kept) and the reason is left in the run's staging folder, where the
    entry point finds it (exit 3) before deleting that folder.
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        settings: EncodeSettings | None = None,
        max_failure_ratio: float = 1.0,
        dataset_name: str | None = None,
    ):
        self._output_dir, self._temp_dir, self._compression = output_dir, temp_dir, compression
        self._settings = settings
        self._max_failure_ratio = max_failure_ratio
        self._dataset_name = dataset_name

    def process(
        self,
        _,
        listed_total,
        listed,
        written,
        failures: FailureCounts,
        failure_parts,
        shards,
        class_index,
        extras=None,
    ) -> Iterable[dict]:
        if listed_total == 0:
            delete_paths([self._temp_dir])
            raise ValueError(f"{USER_ERROR_MARKER} the input holds no image files")
        staging = staging_dir(self._temp_dir)
        _mkdirs(staging)
        staged = {
            name: FileSystems.join(staging, name) for name in (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)
        }
        merge_parts(failure_parts, staged[FAILURES_FILE])  # streamed: one line held per part
        failed = failures.failed
        if too_many_failures(failed, listed_total, self._max_failure_ratio):
            # The job itself succeeds (a raise here would print the runner's traceback); the
            # entry point finds the reason in the staging folder and exits with
            # EXIT_TOO_MANY_FAILURES. A dataset already in the folder is kept.
            kept = publish_failures_only(self._output_dir, staged[FAILURES_FILE])
            where = FileSystems.join(self._output_dir, ABORTED_FAILURES_FILE if kept else FAILURES_FILE)
            mark_aborted(
                self._temp_dir,
                f"{failed} of {listed_total} images failed ({failed / listed_total:.1%}), "
                f"more than --max_failure_ratio {self._max_failure_ratio:g} allows; no dataset was "
                f"written{' (the dataset already there is kept)' if kept else ''}, the failures are in {where}; "
                + diagnosis_of_kinds(dict(failures.by_kind)),
            )
            return
        write_text(staged[LABELS_FILE], "".join(n + "\n" for n in class_index.names))
        summary = build_summary(
            listed_total, dict(listed), dict(written), failures, shards, class_index, self._settings
        )
        summary.update(extras or {})  # sections added by optional steps (e.g. "labels")
        problem = accounting_error(summary)
        if problem:  # a bug, not bad input: fail loudly and publish nothing
            raise RuntimeError(f"images lost or double-counted ({problem}); nothing was published")
        write_text(staged[SUMMARY_FILE], json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        # Shards (with their index files) in plan order per split, then the metadata,
        # summary.json last.
        moves = []
        suffix = shard_suffix(self._compression)
        by_split: dict[str, list[ShardResult]] = collections.defaultdict(list)
        for s in shards:
            by_split[s.split].append(s)
        split_shards: dict[str, list[int]] = {}
        # Which shards have an index file: one listing per temp folder, not a request per shard.
        indexed = existing_files([index_path(s.temp_path) for s in shards])
        for split, results in sorted(by_split.items()):
            results = sorted(results, key=lambda s: (s.index, s.temp_path))  # plan order
            n = len(results)
            split_shards[split] = [s.records for s in results]
            for i, result in enumerate(results):
                final = f"{split}-{i:05d}-of-{n:05d}{suffix}"
                moves.append((result.temp_path, final))
                if index_path(result.temp_path) in indexed:
                    moves.append((index_path(result.temp_path), index_path(final)))
        formats = {f for s in shards for f in s.formats}
        reader_files = write_reader_metadata(
            staging,
            summary,
            schema_from_summary(summary),
            split_shards,
            self._compression,
            formats,
            name=self._dataset_name or tfds_name(self._output_dir),
        )
        if FileSystems.exists(FileSystems.join(staging, ORPHANS_FILE)):  # written by WriteOrphans
            reader_files.append(ORPHANS_FILE)
        moves += [(FileSystems.join(staging, name), name) for name in reader_files]
        moves += [(staged[name], name) for name in (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)]
        publish(self._output_dir, moves)
        delete_paths([self._temp_dir])
        yield summary


class WriteMetadata(beam.PTransform):
    """Waits for every shard, renames them into place and writes the metadata files.

    `files` are the PCollections of listed images (FileBatches, Failures; or RecordBatches
    and Failures after a join) and `records` the labelled ones (RecordBatches), counted for
    summary.json.
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        *,
        files: Sequence[beam.PCollection[FileBatch | RecordBatch | Failure]],
        records: beam.PCollection[RecordBatch],
        failed: beam.PCollection[Failure],
        shards: beam.PCollection[ShardResult],
        class_index: beam.PCollection[ClassIndex],
        settings: EncodeSettings | None = None,
        max_failure_ratio: float = 1.0,
        dataset_name: str | None = None,
        summary_extras: beam.PCollection[dict] | None = None,
    ):
        super().__init__()
        self._fn = FinalizeFn(output_dir, temp_dir, compression, settings, max_failure_ratio, dataset_name)
        self._staging = staging_dir(temp_dir)
        self._files, self._records = tuple(files), records
        self._failed, self._shards, self._class_index = failed, shards, class_index
        self._extras = summary_extras

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[dict]:
        # Lifted combiners without a default element (an empty input leaves the side inputs
        # at their defaults): one cheap call per batch, no extra steps.
        # Each input counted where it is made (a Map fused into its producer, no decode of
        # the batches again), then the counts summed.
        counts = [
            pcoll | f"CountListed{i}" >> beam.Map(images_in).with_output_types(int)
            for i, pcoll in enumerate(self._files)
        ]
        listed_total = (
            counts
            | "AllListed" >> beam.Flatten().with_output_types(int)
            | "CountListed" >> beam.CombineGlobally(sum).without_defaults()
        )
        listed = (
            self._records
            | "CountListedPerClass" >> beam.CombineGlobally(CountPerClassFn()).without_defaults()
            | "ListedSide" >> beam.Map(SideDict).with_output_types(SideDict)
        )
        extras = self._extras if self._extras is not None else pbegin | "NoExtras" >> beam.Create([{}])
        # Failures: counted by a combiner (stages, classes), written as sorted parts of
        # ~PART_SIZE failures (one group a part), merged into failures.jsonl by FinalizeFn.
        failure_counts = pvalue.AsSingleton(
            self._failed | "CountFailures" >> beam.CombineGlobally(FailureCountsFn()).without_defaults(),
            default_value=FailureCounts(),
        )
        # Written per (split, class) from a combiner; the shard list without those counts (one
        # small ShardResult a shard: per class, a shard's counts add up to the dataset's size).
        written = (
            self._shards
            | "CountWritten" >> beam.CombineGlobally(WrittenPerClassFn()).without_defaults()
            | "WrittenSide" >> beam.Map(SideDict).with_output_types(SideDict)
        )
        shards = self._shards | "ShardsOnly" >> beam.Map(lambda s: dataclasses.replace(s, written=()))
        parts = (
            self._failed
            | "KeyFailures" >> beam.Map(lambda f, c: (part_of(f, c.failed), f), failure_counts)
            | "GroupFailures" >> beam.GroupByKey()  # (part, [Failure]): ~PART_SIZE failures
            | "WriteFailureParts"
            >> beam.ParDo(WriteFailurePartsFn(self._staging, f"{self.label}/GroupFailures"))
        )  # part file paths: one per PART_SIZE failures
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Finalize"
            >> beam.ParDo(
                self._fn,
                pvalue.AsSingleton(listed_total, default_value=0),
                pvalue.AsSingleton(listed, default_value={}),
                pvalue.AsSingleton(written, default_value={}),
                failure_counts,
                pvalue.AsList(parts),
                pvalue.AsList(shards),
                pvalue.AsSingleton(self._class_index),
                pvalue.AsSingleton(extras),
            )
        )
