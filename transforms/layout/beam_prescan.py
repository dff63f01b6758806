"""Opt-in passes over the image files before shard planning: dedupe and size estimates.

- `--dedupe` hashes every file's content (a streaming read; only (sha256, record) leaves the
  DoFn) and keeps the smallest relpath of each hash; every other copy is a failure 'duplicate
  of <relpath>' (stage 'dedupe'), so `listed == written + failed` still holds.
- Options that change the stored bytes (resize, re-encode, colour, raw) make a record's size
  differ from its file's: each file's header gives the estimated stored size, so size-based
  shards still land near the target. With `--dedupe` the estimate comes from the same read.
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


class EstimateSizes(beam.PTransform):
    """Replaces each record's file size by the size it will have once converted."""

    def __init__(self, options: ImageOptions):
        super().__init__()
        self._options = options

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        options = self._options

        def estimate(batch: RecordBatch) -> RecordBatch:
            return RecordBatch(tuple(estimated(r, options) for r in batch.records))

        return records | beam.Map(estimate).with_output_types(RecordBatch)


class HashContentFn(beam.DoFn):
    """RecordBatch -> (content key, record) per image; unreadable files get a key of their own
    (reported by WriteShards when it reads the file)."""

    def __init__(self, options: ImageOptions | None):
        self._options = options
        self._check = functools.partial(check_header, max_pixels=(options or ImageOptions()).max_pixels)
        self._hashed = Metrics.counter(self.__class__, "images_hashed")

    def process(self, batch: RecordBatch) -> Iterable[tuple[str, ImageRecord]]:
        for record in batch.records:
            try:
                key, header = hash_and_header(record.path, self._check, record.size)
            except (OSError, ImageError):
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
        self._dropped.inc(len(failures))
        for failure in failures:
            yield pvalue.TaggedOutput(FAILED, failure)


class DropDuplicates(beam.PTransform):
    """Keeps one record per distinct file content. Outputs `.records` (RecordBatch) and `.failed`.

    `options`: when given, the kept records' sizes are replaced by estimates (see module).
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
