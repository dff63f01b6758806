"""Opt-in passes over the image files before shard planning: dedupe and size estimates.

Shards are planned from file sizes before images are read. Two options need more:

- `--dedupe` hashes every file's content (a streaming read; only (sha256, record) metadata
  leaves the DoFn) and keeps the first path of each hash; every other copy is reported
  as a failure with reason 'duplicate of <relpath>' (stage 'dedupe'). So
  `listed == written + failed` still holds, and summary.json counts them in
  `failed_by_stage.dedupe` and `duplicates`.
- Options that change the stored bytes (resize, re-encode, colour, raw) make a record's
  size differ from its file's. `EstimateSizes` reads each file's first bytes (the header)
  and replaces `ImageRecord.size` with `estimate_stored_size(...)`, so size-based shards
  still land near the target. With `--dedupe` the estimate comes from the same read.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from transforms.batching import RebatchFn, group_size
from transforms.failures import FAILED
from transforms.images.limits import check_header
from transforms.images.types import ImageError, ImageOptions
from transforms.layout.prescan import estimated, hash_and_header, split_duplicates, with_estimated_size
from transforms.records import ImageRecord, RecordBatch


class EstimateSizesFn(beam.DoFn):
    """RecordBatch -> the same records with their estimated stored sizes."""

    def __init__(self, options: ImageOptions):
        self._options = options

    def process(self, batch: RecordBatch) -> Iterable[RecordBatch]:
        yield RecordBatch(tuple(estimated(r, self._options) for r in batch.records))


class EstimateSizes(beam.PTransform):
    """Replaces each record's file size by the size it will have once converted."""

    def __init__(self, options: ImageOptions):
        super().__init__()
        self._options = options

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        return records | beam.ParDo(EstimateSizesFn(self._options)).with_output_types(RecordBatch)


class HashContentFn(beam.DoFn):
    """RecordBatch -> (content key, record) per image; unreadable files get a key of their own."""

    def __init__(self, options: ImageOptions | None):
        self._options = options
        max_pixels = (options or ImageOptions()).max_pixels
        self._check = functools.partial(check_header, max_pixels=max_pixels)
        self._hashed = Metrics.counter(self.__class__, "images_hashed")

    def process(self, batch: RecordBatch) -> Iterable[tuple[str, ImageRecord]]:
        for record in batch.records:
            try:
                key, header = hash_and_header(record.path, self._check, record.size)
            except (OSError, ImageError):  # reported by WriteShards when it reads the file
                yield f"unreadable:{record.path}", record
                continue
            self._hashed.inc()
            if self._options is not None:
                record = with_estimated_size(record, header, self._options)
            yield key, record


class DropDuplicatesFn(RebatchFn):
    """(content key, [records]) -> the kept records, in RecordBatches; FAILED for every other copy."""

    def __init__(self, step: str = "GroupByContent"):
        self._dropped = Metrics.counter(self.__class__, "duplicates_dropped")
        self._sizes = group_size(step)

    def process(self, group: tuple[str, Iterable[ImageRecord]]) -> Iterable:
        records = list(group[1])
        self._sizes.update(len(records))
        kept, failures = split_duplicates(records)
        yield from self.batched(kept)
        for failure in failures:
            self._dropped.inc()
            yield pvalue.TaggedOutput(FAILED, failure)


class DropDuplicates(beam.PTransform):
    """Keeps one record per distinct file content. Outputs `.records` (RecordBatch) and `.failed`.

    Args:
      options: when given, the kept records' sizes are replaced by estimates (see module).
    """

    def __init__(self, options: ImageOptions | None = None):
        super().__init__()
        self._options = options

    def expand(self, records: beam.PCollection[RecordBatch]) -> pvalue.DoOutputsTuple:
        keep = beam.ParDo(DropDuplicatesFn(f"{self.label}/GroupByContent")).with_output_types(RecordBatch)
        return (
            records
            | "HashContent"
            >> beam.ParDo(HashContentFn(self._options)).with_output_types(tuple[str, ImageRecord])
            # (sha256, [ImageRecord]): the copies of one file content (one record unless duplicated)
            | "GroupByContent" >> beam.GroupByKey()
            | "KeepFirst" >> keep.with_outputs(FAILED, main="records")  # RecordBatch, .failed
        )
