"""The Beam shells of the labels table: ReadLabels, WebDatasetLabels, JoinLabels.

In: the table's files (or WebDataset sidecar labels: tuples of SampleLabel from the listing),
FileBatches of images. Out: labelled RecordBatches, Failures, orphan
rows (output/beam_orphans.py writes them) and the join's counts. Rows, images and orphans
travel as Arrow record batches (transforms/coders.py ArrowBatchCoder), never one element (or
Python object) per row or image. Bounds: see JoinLabels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import CountImagesFn, group_size
from transforms.coders import Listed
from transforms.failures import FAILED, USER_ERROR_MARKER
from transforms.gcs import literal_or_glob
from transforms.labels.join import bucket_count, files_batch, join_bucket, split_by_bucket
from transforms.labels.rows import (
    DUPLICATE_POLICIES,
    ERROR,
    FORMATS,
    IMAGE_KEYS,
    LISTED,
    ORPHANS,
    RELPATH,
    STATS,
    UNLABELED_POLICIES,
    JoinSettings,
    LabelMap,
    LabelRow,
    TableError,
    TableSpec,
    file_schema,
    row_schema,
    rows_batch,
)
from transforms.labels.table import check_regular_file, image_key, iter_row_batches, split_labels
from transforms.listing.webdataset import SampleLabel
from transforms.records import BATCH_SIZE, FileBatch, RecordBatch

# Rows or images a BucketFn holds at most before it sends them (bounds its memory: Arrow
# columns, ~50 bytes a row).
_MAX_HELD = 200 * BATCH_SIZE


class ReadLabelsFn(beam.DoFn):
    """A matched table file -> Arrow batches of its rows, parsed as a stream (never loaded whole)."""

    def __init__(self, spec: TableSpec):
        self._spec = spec
        self._rows = Metrics.counter(self.__class__, "label_rows")
        self._invalid = Metrics.counter(self.__class__, "label_rows_invalid")

    def process(self, readable: fileio.ReadableFile) -> Iterator[pa.RecordBatch]:
        source = readable.metadata.path
        try:
            check_regular_file(source)
            with readable.open(mime_type="application/octet-stream") as f:
                for batch in iter_row_batches(f, self._spec, source):
                    self._rows.inc(batch.num_rows)
                    self._invalid.inc(batch.num_rows - batch.column(ERROR).null_count)
                    yield batch
        except TableError as e:
            raise ValueError(f"{USER_ERROR_MARKER} {e}") from None


class ReadLabels(beam.PTransform):
    """Reads the labels table (a file or a glob, local or gs://; matched and read on the
    workers, a file a stream) into Arrow batches of rows (a block of a file each)."""

    def __init__(self, spec: TableSpec):
        super().__init__()
        if spec.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}")
        self._spec = spec

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[pa.RecordBatch]:
        return (
            pbegin
            | "MatchTable" >> fileio.MatchFiles(literal_or_glob(self._spec.path))
            | "OpenTable" >> fileio.ReadMatches()
            | "ParseRows" >> beam.ParDo(ReadLabelsFn(self._spec)).with_output_types(pa.RecordBatch)
        )


class BucketFn(beam.DoFn):
    """FileBatch (with `image_key_mode`: keyed as files_batch) or a batch of rows -> (bucket,
    Arrow batch): the bundle's items held, then cut by key bucket at once (split_by_bucket),
    so that parts stay large when buckets are many. Bounds: it holds at most _MAX_HELD items."""

    def __init__(self, per_bucket: int, image_key_mode: str | None = None):
        self._per_bucket, self._mode = per_bucket, image_key_mode

    def start_bundle(self) -> None:
        self._held: list[pa.RecordBatch] = []
        self._count = 0
        self._buckets = 1

    def process(self, batch, images: int, rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        batch = batch if self._mode is None else files_batch(batch, self._mode)
        self._held.append(batch)
        self._count += batch.num_rows
        self._buckets = bucket_count(images, rows, self._per_bucket)
        if self._count >= _MAX_HELD:
            yield from self._take()

    def finish_bundle(self) -> Iterator:
        for part in self._take():
            yield GlobalWindows.windowed_value(part)

    def _take(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        held, self._held, self._count = self._held, [], 0
        if held:
            yield from split_by_bucket(pa.Table.from_batches(held), self._buckets)


def _tables(parts: Iterable[pa.RecordBatch]) -> tuple[pa.Table, pa.Table]:
    """A bucket's parts as (its images, its rows)."""
    sides: dict[bool, list] = {True: [], False: []}  # images have a relpath
    for part in parts:
        sides[RELPATH in part.schema.names].append(part)
    images, rows = sides[True], sides[False]
    empty = file_schema() if not images else None, row_schema() if not rows else None
    return pa.Table.from_batches(images, schema=empty[0]), pa.Table.from_batches(rows, schema=empty[1])


class JoinLabelsFn(beam.DoFn):
    """(bucket, [Arrow batch]) -> RecordBatches of the bucket's labelled images; FAILED,
    ORPHANS (an Arrow batch of orphan rows), STATS and LISTED (each RecordBatch and
    Failure again) as tagged outputs; --label_map as the side input `label_map`."""

    def __init__(self, settings: JoinSettings, step: str = "GroupByBucket"):
        self._settings = settings
        self._sizes = group_size(step)  # images + rows of each bucket
        self._labeled = Metrics.counter(self.__class__, "images_labeled")
        self._failed = Metrics.counter(self.__class__, "images_without_label")
        self._orphans = Metrics.counter(self.__class__, "orphan_label_rows")

    def process(
        self, element: tuple[int, Iterable[pa.RecordBatch]], label_map: LabelMap | None = None
    ) -> Iterator:
        images, rows = _tables(element[1])
        self._sizes.update(images.num_rows + rows.num_rows)
        settings = (
            self._settings if label_map is None else dataclasses.replace(self._settings, label_map=label_map)
        )
        result = join_bucket(images, rows, settings)
        labeled = len(result.columns[0])
        self._labeled.inc(labeled)
        self._failed.inc(len(result.failures))
        self._orphans.inc(result.stats.get("orphan_rows", 0))
        for start in range(0, labeled, BATCH_SIZE):
            batch = RecordBatch.from_columns(*(c[start : start + BATCH_SIZE] for c in result.columns))
            yield batch
            yield pvalue.TaggedOutput(LISTED, batch)
        for failure in result.failures:
            yield pvalue.TaggedOutput(FAILED, failure)
            yield pvalue.TaggedOutput(LISTED, failure)
        for orphans in result.orphans:  # a batch per bucket
            yield pvalue.TaggedOutput(ORPHANS, orphans.combine_chunks().to_batches()[0])
        for item in result.stats.items():
            yield pvalue.TaggedOutput(STATS, item)


@dataclasses.dataclass
class JoinedLabels:
    """The outputs of JoinLabels: `records` (RecordBatches), `failed` (Failures), `listed`
    (both again: every image but those skipped as unlabeled, for batching.CountImagesFn),
    `orphans` (Arrow batches of orphan rows, one per bucket) and `stats` ((count name, n) pairs for summary.json)."""

    records: beam.PCollection
    failed: beam.PCollection
    listed: beam.PCollection
    orphans: beam.PCollection
    stats: beam.PCollection


class JoinLabels(beam.PTransform):
    """Joins listed images with table rows by image key (any table size).

    Images and rows are shuffled as Arrow batches by key bucket (`per_bucket` images or rows
    a bucket, from counts taken meanwhile), each bucket joined on its columns (join_bucket).
    `label_map` (ReadLabelMap's singleton, for --label_map) is a side input of the join.

    Bounds: a GroupByBucket group holds one bucket's images and rows (~`per_bucket` of each
    when keys are spread; all of a key's rows and images are in its bucket, so one key with a
    million rows makes a group of a million). The side inputs are two counts (singletons)
    and the label map (its class names).
    """

    def __init__(
        self,
        image_key_mode: str = "stem",
        settings: JoinSettings = JoinSettings(),
        per_bucket: int = 10 * BATCH_SIZE,
        label_map: beam.PCollection[LabelMap] | None = None,
    ):
        super().__init__()
        if image_key_mode not in IMAGE_KEYS:
            raise ValueError(f"image_key_mode must be one of {IMAGE_KEYS}")
        if settings.unlabeled not in UNLABELED_POLICIES:
            raise ValueError(f"unlabeled must be one of {UNLABELED_POLICIES}")
        if settings.duplicates not in DUPLICATE_POLICIES:
            raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}")
        self._mode, self._settings, self._per_bucket = image_key_mode, settings, per_bucket
        self._label_map = label_map

    def expand(
        self, inputs: tuple[beam.PCollection[FileBatch], beam.PCollection[pa.RecordBatch]]
    ) -> JoinedLabels:
        files, rows = inputs
        mode, per_bucket = self._mode, self._per_bucket
        # Lifted counts (a number per bundle, then one sum): the bucket count as a side input.
        # Without defaults (no extra stage for an empty input): nothing counted reads as 0.
        images = pvalue.AsSingleton(
            files | "CountImages" >> beam.CombineGlobally(CountImagesFn()).without_defaults(), default_value=0
        )
        table = pvalue.AsSingleton(
            rows
            | "RowsPerBatch" >> beam.Map(lambda batch: batch.num_rows)
            | "CountRows" >> beam.CombineGlobally(sum).without_defaults(),
            default_value=0,
        )
        parts = tuple[int, pa.RecordBatch]  # both sides: one element type, one coder
        keyed_images = files | "BucketImages" >> beam.ParDo(
            BucketFn(per_bucket, mode), images, table
        ).with_output_types(parts)
        keyed_rows = rows | "BucketRows" >> beam.ParDo(BucketFn(per_bucket), images, table).with_output_types(
            parts
        )
        side = {} if self._label_map is None else {"label_map": pvalue.AsSingleton(self._label_map)}
        joined = (
            (keyed_images, keyed_rows)
            | "Parts" >> beam.Flatten()
            | "GroupByBucket" >> beam.GroupByKey()  # (bucket, [Arrow batch of images or rows])
            | "Join"
            >> beam.ParDo(JoinLabelsFn(self._settings, f"{self.label}/GroupByBucket"), **side)
            .with_output_types(RecordBatch)
            .with_outputs(FAILED, ORPHANS, STATS, LISTED, main="records")
        )
        joined[ORPHANS].element_type = pa.RecordBatch
        # The records and failures again, as one output of the join (a Flatten of the two
        # would be materialized by the local runner), coded by ListedCoder.
        joined[LISTED].element_type = Listed
        return JoinedLabels(joined.records, joined[FAILED], joined[LISTED], joined[ORPHANS], joined[STATS])


WEBDATASET = "webdataset"  # the --labels value that asks for sidecar labels


def sample_rows(labels: tuple[SampleLabel, ...], image_key_mode: str, separator: str) -> pa.RecordBatch:
    """The rows of sidecar labels: key by `image_key_mode`, labels split at `separator`
    (a label that split_labels refuses makes a row with an error: its image's failure)."""
    rows = []
    for label in labels:
        key = image_key(label.relpath, image_key_mode)
        try:
            rows.append(LabelRow(key, split_labels(label.value, separator), source=label.source))
        except ValueError as e:
            rows.append(LabelRow(key, source=label.source, error=str(e)))
    return rows_batch(rows)


class WebDatasetLabels(beam.PTransform):
    """Tuples of SampleLabel -> Arrow batches of rows (one per tuple), for JoinLabels."""

    def __init__(self, image_key_mode: str, separator: str = "|"):
        super().__init__()
        self._mode, self._separator = image_key_mode, separator

    def expand(self, labels: beam.PCollection[tuple]) -> beam.PCollection[pa.RecordBatch]:
        to_rows = beam.Map(sample_rows, self._mode, self._separator)
        return labels | "ToRows" >> to_rows.with_output_types(pa.RecordBatch)
