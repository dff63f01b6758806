"""Writing: shards through Beam's TFRecord sink, then failures and metadata.

Each ShardTask is written by one WriteShardFn call: it reads, checks and encodes the
shard's images in order and streams them into a temporary file opened with the sink's own
writer (`_TFRecordSink.open_writer`: TFRecord framing, CRCs, compression). When every shard
is written, FinalizeFn renames them with the sink's `finalize_write` (temp then rename, as
`WriteToTFRecord` does) and writes failures.jsonl, labels.txt and, last, summary.json.
"""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam import coders, pvalue
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordSink
from apache_beam.metrics import Metrics

from transforms.encode import EncodeSettings, encode_record
from transforms.failures import FAILED, WRITTEN, Failure
from transforms.image import ImageError
from transforms.labels import ClassIndex
from transforms.prefetch import default_threads, map_in_order
from transforms.progress import Progress, lookup
from transforms.records import ImageFile, ImageRecord, ShardResult, ShardTask, Written

SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
SUMMARY_FILE = "summary.json"
LABELS_FILE = "labels.txt"
FAILURES_FILE = "failures.jsonl"
# Prefixes the message of an error raised inside the pipeline that is the user's to fix.
USER_ERROR_MARKER = "img2tfrecord-user-error:"
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
    """All bytes of `path` through Beam's filesystems (local or gs://)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def _mkdirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except OSError:
        if not FileSystems.exists(path) and "://" not in path:
            raise


def write_text(path: str, text: str) -> None:
    with FileSystems.create(path, mime_type="text/plain") as f:
        f.write(text.encode("utf-8"))


class WriteShardFn(beam.DoFn):
    """ShardTask -> ShardResult; WRITTEN and FAILED per image as tagged outputs.

    `threads` > 1 reads and checks the next images in a thread pool while the current one
    is written (order unchanged); 0 means one thread per core. `progress_key` names the
    run's process-local Progress (transforms/progress.py), if any.
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        settings: EncodeSettings,
        threads: int = 0,
        progress_key: str | None = None,
    ):
        self._output_dir, self._temp_dir = output_dir, temp_dir
        self._compression, self._settings = compression, settings
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
        # The shard number leads the temp name, so the sink's finalize (which sorts
        # temp paths) numbers the shards in plan order.
        writer = sink.open_writer(split_temp, f"{task.index:05d}-{uuid.uuid4().hex}")
        written = size = 0
        settings = self._settings

        def load(record: ImageRecord) -> bytes:  # read + check + encode, in a pool thread
            return encode_record(record, read_file(record.path), class_index, settings)

        for record, result in map_in_order(load, task.records, self._pool):
            try:
                serialized = result()
            except ImageError as e:
                yield self._failure(record, str(e), "decode")
                continue
            except OSError as e:  # missing, unreadable, permission denied, transient I/O
                yield self._failure(record, f"unreadable: {e}", "read")
                continue
            writer.write(serialized)
            written += 1
            size += len(serialized)
            self._encoded.inc()
            self._bytes.inc(len(serialized))  # per image, so the Dataflow UI shows it live
            if self._progress is not None:
                self._progress.add(written=1, nbytes=len(serialized))
            yield pvalue.TaggedOutput(WRITTEN, Written(record.split, record.class_key))
        temp_path = writer.close()
        if not written:
            FileSystems.delete([temp_path])
            return
        yield ShardResult(task.split, task.index, temp_path, written, size)

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
        *,
        threads: int = 0,
        progress_key: str | None = None,
    ):
        super().__init__()
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}")
        if threads < 0:
            raise ValueError("threads must be 0 (one per core) or positive")
        self._fn = WriteShardFn(output_dir, temp_dir, compression, settings, threads, progress_key)
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
) -> dict:
    """The summary.json document. Invariant: listed == written + failed at every level."""

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
    }


class FinalizeFn(beam.DoFn):
    """Runs once after every shard is written: rename shards, then write the metadata."""

    def __init__(self, output_dir: str, temp_dir: str, compression: str):
        self._output_dir, self._temp_dir, self._compression = output_dir, temp_dir, compression

    def process(self, _, listed_total, listed, written, failures, shards, class_index) -> Iterable[dict]:
        if listed_total == 0:
            if FileSystems.exists(self._temp_dir):
                FileSystems.delete([self._temp_dir])
            raise ValueError(f"{USER_ERROR_MARKER} the input holds no image files")
        by_split: dict[str, list[ShardResult]] = collections.defaultdict(list)
        for s in shards:
            by_split[s.split].append(s)
        for split, results in sorted(by_split.items()):
            sink = make_sink(self._output_dir, split, self._compression)
            temp_paths = sorted(s.temp_path for s in results)
            list(sink.finalize_write(FileSystems.join(self._temp_dir, split), temp_paths, None))
        if FileSystems.exists(self._temp_dir):
            FileSystems.delete([self._temp_dir])
        failures = sorted(failures, key=lambda f: (f.path, f.stage))
        out = self._output_dir
        write_text(FileSystems.join(out, FAILURES_FILE), "".join(f.to_json() + "\n" for f in failures))
        write_text(FileSystems.join(out, LABELS_FILE), "".join(n + "\n" for n in class_index.names))
        summary = build_summary(listed_total, dict(listed), dict(written), failures, shards, class_index)
        # Written last: its presence marks a finished dataset.
        write_text(
            FileSystems.join(out, SUMMARY_FILE),
            json.dumps(summary, indent=2, ensure_ascii=False) + "\n",
        )
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
    ):
        super().__init__()
        self._fn = FinalizeFn(output_dir, temp_dir, compression)
        self._files, self._records, self._written = files, records, written
        self._failed, self._shards, self._class_index = failed, shards, class_index

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[dict]:
        listed_total = self._files | "CountListed" >> beam.combiners.Count.Globally()
        listed = (
            self._records
            | "KeyListed" >> beam.Map(lambda r: (r.split, r.class_key))
            | "CountListedPerClass" >> beam.combiners.Count.PerElement()
        )
        written = (
            self._written
            | "KeyWritten" >> beam.Map(lambda w: (w.split, w.class_key))
            | "CountWrittenPerClass" >> beam.combiners.Count.PerElement()
        )
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Finalize"
            >> beam.ParDo(
                self._fn,
                pvalue.AsSingleton(listed_total),
                pvalue.AsDict(listed),
                pvalue.AsDict(written),
                pvalue.AsList(self._failed),
                pvalue.AsList(self._shards),
                pvalue.AsSingleton(self._class_index),
            )
        )
