"""Writing: shards through Beam's TFRecord sink, then failures and metadata.

Each ShardTask is written by one WriteShardFn call: it reads, checks and encodes the
shard's images in order and streams them into a temporary file opened with the sink's own
writer (`_TFRecordSink.open_writer`: TFRecord framing, CRCs, compression). When every shard
is written, FinalizeFn stages failures.jsonl, labels.txt and summary.json next to the temp
shards and publishes everything by renaming it into place (temp then rename, as
`WriteToTFRecord` does), summary.json last; see transforms/output.py.
"""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam import coders, pvalue
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordSink
from apache_beam.metrics import Metrics

from transforms.encode import EncodeSettings, encode_image
from transforms.failures import FAILED, USER_ERROR_MARKER, WRITTEN, Failure
from transforms.image import ImageError, ImageInfo
from transforms.index import index_path, write_index
from transforms.label_table import ORPHANS_FILE
from transforms.labels import ClassIndex, CountPerClassFn
from transforms.output import (
    FAILURES_FILE,
    LABELS_FILE,
    SUMMARY_FILE,
    delete_paths,
    mark_aborted,
    publish,
    staging_dir,
    write_text,
)
from transforms.prefetch import default_threads, map_in_order
from transforms.prescan import DEDUPE_STAGE
from transforms.progress import Progress, lookup
from transforms.reading import DEFAULT_RETRY, RetryPolicy, read_bytes, read_with_retries
from transforms.records import ImageFile, ImageRecord, ShardResult, ShardTask, Written
from transforms.schema import schema_from_summary
from transforms.testhooks import pause_if_asked
from transforms.tfds_metadata import tfds_name, write_reader_metadata

SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
COMPRESSIONS = {"none": CompressionTypes.UNCOMPRESSED, "gzip": CompressionTypes.GZIP}


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def make_sink(output_dir: str, split: str, compression: str = "none") -> _TFRecordSink:
    """Beam's TFRecord sink for one split: `<output_dir>/<split>-SSSSS-of-NNNNN.tfrecord`."""
    return _TFRecordSink(
        file_path_prefix=FileSystems.join(output_dir, split),
        coder=coders.BytesCoder(),
        file_name_suffix=shard_suffix(compression),
        num_shards=0,
        shard_name_template=SHARD_TEMPLATE,
        compression_type=COMPRESSIONS[compression],
    )


def read_file(path: str) -> bytes:
    """All bytes of `path` (local or gs://), transient errors retried with backoff.

    Raises:
      ReadError (an OSError): the reason the file cannot be read.
    """
    return read_with_retries(path)


def _mkdirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except OSError:
        if not FileSystems.exists(path) and "://" not in path:
            raise


class WriteShardFn(beam.DoFn):
    """ShardTask -> ShardResult; WRITTEN and FAILED per image as tagged outputs.

    `threads` > 1 reads and checks the next images in a thread pool while the current one
    is written (order unchanged); 0 means one thread per core. `progress_key` names the
    run's process-local Progress (transforms/progress.py), if any. Reads go through
    `reader` with `retry` (transient errors are retried with backoff).
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        settings: EncodeSettings,
        write_index: bool = False,
        reader: Callable[[str], bytes] = read_bytes,
        retry: RetryPolicy = DEFAULT_RETRY,
        threads: int = 0,
        progress_key: str | None = None,
    ):
        self._output_dir, self._temp_dir = output_dir, temp_dir
        self._compression, self._settings = compression, settings
        # DALI/PyTorch index files exist for uncompressed shards only.
        self._write_index = write_index and compression == "none"
        self._reader, self._retry = reader, retry
        self._threads, self._progress_key = threads, progress_key
        self._encoded = Metrics.counter(self.__class__, "images_encoded")
        self._failed = Metrics.counter(self.__class__, "images_failed")
        self._bytes = Metrics.counter(self.__class__, "bytes_written")
        self._pool: ThreadPoolExecutor | None = None
        self._progress: Progress | None = None

    def setup(self) -> None:
        threads = self._threads or default_threads()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="read-check") if threads > 1 else None
        self._progress = lookup(self._progress_key)

    def teardown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def process(self, task: ShardTask, class_index: ClassIndex) -> Iterable:
        sink = make_sink(self._output_dir, task.split, self._compression)
        split_temp = FileSystems.join(self._temp_dir, task.split)
        _mkdirs(split_temp)
        # The shard number leads the temp name, so the temp paths sort in plan order.
        writer = sink.open_writer(split_temp, f"{task.index:05d}-{uuid.uuid4().hex}")
        written = size = 0
        sizes: list[int] = []
        formats: set[str] = set()
        settings, reader, retry = self._settings, self._reader, self._retry

        def load(record: ImageRecord) -> tuple[bytes, ImageInfo]:  # read + check + encode, in a pool thread
            return encode_image(record, read_with_retries(record.path, reader, retry), class_index, settings)

        for record, result in map_in_order(load, task.records, self._pool):
            try:
                serialized, info = result()
            except ImageError as e:
                yield self._failure(record, str(e), "decode")
                continue
            except OSError as e:  # missing, unreadable, permission denied, transient I/O
                yield self._failure(record, f"unreadable: {e}", "read")
                continue
            writer.write(serialized)
            written += 1
            size += len(serialized)
            sizes.append(len(serialized))
            formats.add(info.format)  # as stored, after any conversion
            self._encoded.inc()
            self._bytes.inc(len(serialized))  # per image, so the Dataflow UI shows it live
            if self._progress is not None:
                self._progress.add(written=1, nbytes=len(serialized))
            yield pvalue.TaggedOutput(WRITTEN, Written(record.split, record.class_key))
            pause_if_asked("write_shard")
        temp_path = writer.close()
        if not written:
            delete_paths([temp_path])
            return
        if self._write_index:
            write_index(temp_path, sizes)
        yield ShardResult(task.split, task.index, temp_path, written, size, tuple(sorted(formats)))

    def _failure(self, record: ImageRecord, reason: str, stage: str) -> pvalue.TaggedOutput:
        self._failed.inc()
        return pvalue.TaggedOutput(
            FAILED, Failure(record.path, reason, stage, record.split, record.class_key)
        )


class WriteShards(beam.PTransform):
    """Writes ShardTasks to temp shards. Outputs `.shards`, `.written` and `.failed`."""

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
    ):
        super().__init__()
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}")
        if threads < 0:
            raise ValueError("threads must be 0 (one per core) or positive")
        self._fn = WriteShardFn(
            output_dir, temp_dir, compression, settings, write_index, reader, retry, threads, progress_key
        )
        self._class_index = class_index

    def expand(self, tasks: beam.PCollection[ShardTask]) -> pvalue.DoOutputsTuple:
        return tasks | beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._class_index)).with_outputs(
            WRITTEN, FAILED, main="shards"
        )


def build_summary(
    listed_total: int,
    listed: dict[tuple[str, str], int],
    written: dict[tuple[str, str], int],
    failures: list[Failure],
    shards: list[ShardResult],
    class_index: ClassIndex,
    settings: EncodeSettings | None = None,
) -> dict:
    """The summary.json document. Invariant: listed == written + failed at every level.

    Duplicates dropped by --dedupe are failures (stage 'dedupe'), also counted in
    `duplicates`; `schema`, `rename_keys`, `store` and `image_format` say how to parse.
    """

    def counts() -> dict:
        return {"listed": 0, "written": 0, "failed": 0}

    splits: dict[str, dict] = {}

    def split_entry(split: str) -> dict:
        if split not in splits:
            splits[split] = {**counts(), "shards": 0, "bytes": 0, "classes": {}}
        return splits[split]

    def class_entry(split: str, cls: str) -> dict:
        return split_entry(split)["classes"].setdefault(cls, counts())

    for (split, cls), n in listed.items():
        split_entry(split)["listed"] += n
        class_entry(split, cls)["listed"] += n
    for (split, cls), n in written.items():
        split_entry(split)["written"] += n
        class_entry(split, cls)["written"] += n
    reasons: collections.Counter = collections.Counter()
    for f in failures:
        reasons[f.stage] += 1
        if f.split is not None:
            split_entry(f.split)["failed"] += 1
            class_entry(f.split, f.class_key or "")["failed"] += 1
    for s in shards:
        split_entry(s.split)["shards"] += 1
        split_entry(s.split)["bytes"] += s.bytes
    written_per_class: collections.Counter = collections.Counter()
    for (_, cls), n in written.items():
        written_per_class[cls] += n
    for entry in splits.values():
        entry["classes"] = dict(sorted(entry["classes"].items()))
    return {
        "listed": listed_total,
        "written": sum(written.values()),
        "failed": len(failures),
        "failed_by_stage": dict(sorted(reasons.items())),
        "written_per_class": dict(sorted(written_per_class.items())),
        "num_classes": len(class_index.names),
        "class_names": list(class_index.names),
        "label_offset": class_index.offset,
        "splits": dict(sorted(splits.items())),
        **_image_fields(settings or EncodeSettings(), reasons),
    }


def _image_fields(settings: EncodeSettings, reasons: collections.Counter) -> dict:
    """How images were stored and which schema to parse them with (see transforms.schema)."""
    return {
        "schema": settings.schema,
        "rename_keys": dict(settings.rename_keys),
        "store": settings.store,
        "image_format": settings.image_format,
        "duplicates": reasons.get(DEDUPE_STAGE, 0),
    }


def accounting_error(summary: dict) -> str | None:
    """Where `listed == written + failed` does not hold in a summary, or None.

    Checked at the top level, per split and per class before anything is published: a
    mismatch means an image was lost (or counted twice) by a bug, and must not pass silently.
    """

    def mismatch(where: str, c: dict) -> str | None:
        if c["listed"] != c["written"] + c["failed"]:
            return f"{where}: listed {c['listed']} != written {c['written']} + failed {c['failed']}"
        return None

    problems = [mismatch("dataset", summary)]
    for split, entry in summary.get("splits", {}).items():
        problems.append(mismatch(f"split {split!r}", entry))
        problems += [mismatch(f"class {c!r} of split {split!r}", v) for c, v in entry["classes"].items()]
    return next((p for p in problems if p), None)


def too_many_failures(failed: int, listed: int, max_ratio: float) -> bool:
    """True when more than `max_ratio` of the listed images failed."""
    return listed > 0 and failed > max_ratio * listed


class FinalizeFn(beam.DoFn):
    """Runs once after every shard is written: stage the metadata, then publish it all.

    The shards and metadata are staged in the run's temp folder and renamed into place by
    `transforms.output.publish`, summary.json last. Above `max_failure_ratio` only
    failures.jsonl is published (no dataset) and the reason is recorded in the output's
    in-progress marker, where the entry point finds it (exit 3).
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
        self, _, listed_total, listed, written, failures, shards, class_index, extras=None
    ) -> Iterable[dict]:
        if listed_total == 0:
            delete_paths([self._temp_dir])
            raise ValueError(f"{USER_ERROR_MARKER} the input holds no image files")
        failures = sorted(failures, key=lambda f: (f.path, f.stage))
        staging = staging_dir(self._temp_dir)
        _mkdirs(staging)
        staged = {
            name: FileSystems.join(staging, name) for name in (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)
        }
        write_text(staged[FAILURES_FILE], "".join(f.to_json() + "\n" for f in failures))
        if too_many_failures(len(failures), listed_total, self._max_failure_ratio):
            # The job itself succeeds (a raise here would print the runner's traceback); the
            # entry point finds the reason in the marker and exits with EXIT_TOO_MANY_FAILURES.
            publish(self._output_dir, [(staged[FAILURES_FILE], FAILURES_FILE)], keep_marker=True)
            mark_aborted(
                self._output_dir,
                f"{len(failures)} of {listed_total} images failed ({len(failures) / listed_total:.1%}), "
                f"more than --max_failure_ratio {self._max_failure_ratio:g} allows; no dataset was "
                f"written, the failures are in {FileSystems.join(self._output_dir, FAILURES_FILE)}",
            )
            delete_paths([self._temp_dir])
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
        for split, results in sorted(by_split.items()):
            results = sorted(results, key=lambda s: s.temp_path)
            n = len(results)
            split_shards[split] = [s.records for s in results]
            for i, result in enumerate(results):
                final = f"{split}-{i:05d}-of-{n:05d}{suffix}"
                moves.append((result.temp_path, final))
                if FileSystems.exists(index_path(result.temp_path)):
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
    """Waits for every shard, renames them into place and writes the metadata files."""

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        *,
        files: beam.PCollection[ImageFile],
        records: beam.PCollection[ImageRecord],
        written: beam.PCollection[Written],
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
        self._files, self._records, self._written = files, records, written
        self._failed, self._shards, self._class_index = failed, shards, class_index
        self._extras = summary_extras

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[dict]:
        # Lifted combiners without a default element (an empty input leaves the side inputs
        # at their defaults): one cheap call per image, no extra steps.
        count = beam.combiners.CountCombineFn()
        listed_total = self._files | "CountListed" >> beam.CombineGlobally(count).without_defaults()
        listed = (
            self._records
            | "CountListedPerClass" >> beam.CombineGlobally(CountPerClassFn()).without_defaults()
        )  # {(split, class): n}
        written = (
            self._written
            | "KeyWritten" >> beam.Map(lambda w: (w.split, w.class_key))
            | "CountWrittenPerClass" >> beam.combiners.Count.PerElement()
        )
        extras = self._extras if self._extras is not None else pbegin | "NoExtras" >> beam.Create([{}])
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Finalize"
            >> beam.ParDo(
                self._fn,
                pvalue.AsSingleton(listed_total, default_value=0),
                pvalue.AsSingleton(listed, default_value={}),
                pvalue.AsDict(written),
                pvalue.AsList(self._failed),
                pvalue.AsList(self._shards),
                pvalue.AsSingleton(self._class_index),
                pvalue.AsSingleton(extras),
            )
        )
