"""The Beam shells of the labels table: ReadLabels, JoinLabels, WriteOrphans.

In: the table's files, FileBatches of images. Out: labelled RecordBatches, Failures,
orphan_labels.jsonl and the join's counts. Rows, images and orphans travel as column
batches, never one element per row or image. Bounds: see JoinLabels and WriteOrphans.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms import gcs
from transforms.batching import CountImagesFn, group_size
from transforms.failures import FAILED, USER_ERROR_MARKER
from transforms.gcs import literal_or_glob
from transforms.labels.beam_coders import Listed
from transforms.labels.join import (
    bucket_count,
    bucket_parts,
    join_bucket,
    label_summary,
    orphan_lines,
)
from transforms.labels.rows import (
    _MAX_HELD,
    DUPLICATE_POLICIES,
    FORMATS,
    IMAGE_KEYS,
    LISTED,
    ORPHANS,
    ORPHANS_FILE,
    STATS,
    UNLABELED_POLICIES,
    JoinPart,
    JoinSettings,
    KeyedFiles,
    LabelMap,
    LabelRows,
    OrphanLines,
    TableError,
    TableSpec,
)
from transforms.labels.table import _BLOCK_BYTES, check_regular_file, image_keys, iter_row_batches
from transforms.records import BATCH_SIZE, FileBatch, RecordBatch


class ReadLabelsFn(beam.DoFn):
    """A matched table file -> its LabelRows batches, parsed as a stream (never loaded whole)."""

    def __init__(self, spec: TableSpec):
        self._spec = spec
        self._rows = Metrics.counter(self.__class__, "label_rows")
        self._invalid = Metrics.counter(self.__class__, "label_rows_invalid")

    def process(self, readable: fileio.ReadableFile) -> Iterator[LabelRows]:
        source = readable.metadata.path
        try:
            check_regular_file(source)
            with readable.open(mime_type="application/octet-stream") as f:
                for batch in iter_row_batches(f, self._spec, source):
                    self._rows.inc(len(batch))
                    self._invalid.inc(len(batch) - batch.errors.count(None))
                    yield batch
        except TableError as e:
            raise ValueError(f"{USER_ERROR_MARKER} {e}") from None


class ReadLabels(beam.PTransform):
    """Reads the labels table (a file or a glob, local or gs://; matched and read on the
    workers, a file a stream) into LabelRows batches (up to BATCH_SIZE rows of one file)."""

    def __init__(self, spec: TableSpec):
        super().__init__()
        if spec.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}")
        self._spec = spec

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[LabelRows]:
        return (
            pbegin
            | "MatchTable" >> fileio.MatchFiles(literal_or_glob(self._spec.path))
            | "OpenTable" >> fileio.ReadMatches()
            | "ParseRows" >> beam.ParDo(ReadLabelsFn(self._spec)).with_output_types(LabelRows)
        )


def key_files(batch: FileBatch, image_key_mode: str) -> KeyedFiles:
    """A FileBatch's files with their join keys, as columns."""
    paths, relpaths, sizes = batch.columns()
    return KeyedFiles(tuple(image_keys(relpaths, image_key_mode)), paths, relpaths, sizes)


class BucketFn(beam.DoFn):
    """FileBatch (with `image_key_mode`) or LabelRows -> (bucket, JoinPart): the bundle's
    items held, then split by key bucket at once (join.bucket_parts: parts stay large when
    buckets are many), a bucket's items sent in parts of up to BATCH_SIZE. Bounds: it holds
    at most _MAX_HELD items."""

    def __init__(self, per_bucket: int, image_key_mode: str | None = None):
        self._per_bucket, self._mode = per_bucket, image_key_mode

    def start_bundle(self) -> None:
        self._held: list[list] = []  # the held items' columns
        self._buckets = 1

    def process(self, batch: FileBatch | LabelRows, images: int, rows: int) -> Iterator[tuple[int, JoinPart]]:
        columns = batch.columns() if self._mode is None else key_files(batch, self._mode).columns()
        self._held = self._held or [[] for _ in columns]
        for held, values in zip(self._held, columns):
            held.extend(values)
        self._buckets = bucket_count(images, rows, self._per_bucket)
        if len(self._held[0]) >= _MAX_HELD:
            yield from self._take()

    def finish_bundle(self) -> Iterator:
        for part in self._take():
            yield GlobalWindows.windowed_value(part)

    def _take(self) -> Iterator[tuple[int, JoinPart]]:
        held, self._held = self._held, []
        side = LabelRows if self._mode is None else KeyedFiles
        for bucket, columns in bucket_parts(held, self._buckets) if held else ():
            for start in range(0, len(columns[0]), BATCH_SIZE):
                items = side(*(column[start : start + BATCH_SIZE] for column in columns))
                yield bucket, JoinPart(rows=items) if side is LabelRows else JoinPart(files=items)


class JoinLabelsFn(beam.DoFn):
    """(bucket, [JoinPart]) -> RecordBatches of the bucket's labelled images; FAILED, ORPHANS,
    STATS and LISTED (each RecordBatch and Failure again) as tagged outputs; --label_map as
    the side input `label_map`."""

    def __init__(self, settings: JoinSettings, step: str = "GroupByBucket"):
        self._settings = settings
        self._sizes = group_size(step)  # images + rows of each bucket
        self._labeled = Metrics.counter(self.__class__, "images_labeled")
        self._failed = Metrics.counter(self.__class__, "images_without_label")
        self._orphans = Metrics.counter(self.__class__, "orphan_label_rows")

    def process(self, element: tuple[int, Iterable[JoinPart]], label_map: LabelMap | None = None) -> Iterator:
        parts = list(element[1])
        self._sizes.update(sum(map(len, parts)))
        settings = (
            self._settings if label_map is None else dataclasses.replace(self._settings, label_map=label_map)
        )
        result = join_bucket(parts, settings)
        labeled = len(result.columns[0])
        self._labeled.inc(labeled)
        self._failed.inc(len(result.failures))
        self._orphans.inc(len(result.orphans))
        for start in range(0, labeled, BATCH_SIZE):
            batch = RecordBatch.from_columns(*(tuple(c[start : start + BATCH_SIZE]) for c in result.columns))
            yield batch
            yield pvalue.TaggedOutput(LISTED, batch)
        for failure in result.failures:
            yield pvalue.TaggedOutput(FAILED, failure)
            yield pvalue.TaggedOutput(LISTED, failure)
        for lines in orphan_lines(result.orphans):  # a batch per chunk of table lines
            yield pvalue.TaggedOutput(ORPHANS, lines)
        for item in result.stats.items():
            yield pvalue.TaggedOutput(STATS, item)


@dataclasses.dataclass
class JoinedLabels:
    """The outputs of JoinLabels: `records` (RecordBatches), `failed` (Failures), `listed`
    (both again: every image but those skipped as unlabeled, for batching.CountImagesFn),
    `orphans` (OrphanLines) and `stats` ((count name, n) pairs for summary.json)."""

    records: beam.PCollection
    failed: beam.PCollection
    listed: beam.PCollection
    orphans: beam.PCollection
    stats: beam.PCollection


class JoinLabels(beam.PTransform):
    """Joins listed images with table rows by image key (any table size).

    Images and rows are shuffled in column parts by key bucket (`per_bucket` images or rows a
    bucket, from counts taken meanwhile), each bucket joined on its columns (join_bucket).
    `label_map` (ReadLabelMap's singleton, for --label_map) is a side input of the join.

    Bounds: a GroupByBucket group holds one bucket's images and rows (~`per_bucket` of each,
    10,000 so that a BucketFn's flush of _MAX_HELD makes parts of ~1,000, when keys are
    spread; all of a key's rows and images are in its bucket, so one key with a million rows
    makes a group of a million). The side inputs are two counts (singletons)
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

    def expand(self, inputs: tuple[beam.PCollection[FileBatch], beam.PCollection[LabelRows]]) -> JoinedLabels:
        files, rows = inputs
        mode, per_bucket = self._mode, self._per_bucket
        # Lifted counts (a number per bundle, then one sum): the bucket count as a side input.
        # Without defaults (no extra stage for an empty input): nothing counted reads as 0.
        images = pvalue.AsSingleton(
            files | "CountImages" >> beam.CombineGlobally(CountImagesFn()).without_defaults(), default_value=0
        )
        table = pvalue.AsSingleton(
            rows
            | "RowsPerBatch" >> beam.Map(len)
            | "CountRows" >> beam.CombineGlobally(sum).without_defaults(),
            default_value=0,
        )
        # Both sides have the one element type (bucket, JoinPart): the Flatten before the
        # GroupByKey needs one coder on both inputs (JoinPartCoder).
        keyed_images = files | "BucketImages" >> beam.ParDo(
            BucketFn(per_bucket, mode), images, table
        ).with_output_types(tuple[int, JoinPart])
        keyed_rows = rows | "BucketRows" >> beam.ParDo(BucketFn(per_bucket), images, table).with_output_types(
            tuple[int, JoinPart]
        )
        side = {} if self._label_map is None else {"label_map": pvalue.AsSingleton(self._label_map)}
        joined = (
            (keyed_images, keyed_rows)
            | "Parts" >> beam.Flatten()
            | "GroupByBucket" >> beam.GroupByKey()  # (bucket, [JoinPart])
            | "Join"
            >> beam.ParDo(JoinLabelsFn(self._settings, f"{self.label}/GroupByBucket"), **side)
            .with_output_types(RecordBatch)
            .with_outputs(FAILED, ORPHANS, STATS, LISTED, main="records")
        )
        joined[ORPHANS].element_type = OrphanLines  # coded by OrphanLinesCoder, not pickled
        # The records and failures again, as one output of the join (a Flatten of the two
        # would be materialized by the local runner), coded by ListedCoder.
        joined[LISTED].element_type = Listed
        return JoinedLabels(joined.records, joined[FAILED], joined[LISTED], joined[ORPHANS], joined[STATS])


class WriteOrphans(beam.PTransform):
    """Writes orphan rows to <output_dir>/orphan_labels.jsonl; returns the summary section.

    Never one list of all orphans: OrphanLines are grouped by the chunk of table lines where
    their key's first row is (join._ORPHAN_CHUNK_LINES of a file's lines: a group holds the
    orphan rows of the keys first seen there, in at most one element per join bucket), each
    group sorted (OrphanRow.order) and written as a part; one step appends the parts in order
    (streamed; its side input is one path per chunk). The returned singleton
    ({"labels": {...}}) comes after the file is written, so summary.json waits for it.
    """

    def __init__(self, output_dir: str, spec: TableSpec, settings: JoinSettings):
        super().__init__()
        self._path = FileSystems.join(output_dir, ORPHANS_FILE)
        self._spec, self._settings = spec, settings

    def expand(self, joined: Mapping[str, beam.PCollection]) -> beam.PCollection[dict]:
        spec, settings, path = self._spec, self._settings, self._path
        parts = (
            joined[ORPHANS]
            | "ByChunk" >> beam.Map(lambda o: (o.chunk, o.lines))
            | "GroupByChunk" >> beam.GroupByKey()  # ((source, chunk), [((order, json line), ...)])
            | "WriteParts"
            >> beam.Map(
                lambda kv: write_orphan_part(kv[0], chain.from_iterable(kv[1]), path)
            )  # (chunk, part)
        )
        once = joined[ORPHANS].pipeline | "Once" >> beam.Create([None])
        written = once | "Concatenate" >> beam.Map(
            lambda _, found: concatenate_parts(path, found), pvalue.AsList(parts)
        )
        counts = joined[STATS] | "SumCounts" >> beam.CombinePerKey(sum)  # (name, n)
        return once | "Summarize" >> beam.Map(
            lambda _, c, _file: label_summary(c, spec, settings),
            pvalue.AsDict(counts),
            pvalue.AsSingleton(written),
        )


def write_orphan_part(chunk: tuple[str, int], lines: Iterable[tuple[tuple, str]], path: str) -> tuple:
    """Writes one chunk's orphan lines, sorted, beside `path`; returns (chunk, part path)."""
    digest = zlib.crc32(repr(chunk).encode("utf-8", "surrogateescape"))
    part = f"{path}.part-{digest:08x}-{chunk[1]:06d}"
    text = "".join(line + "\n" for _, line in sorted(lines))  # by order (unique)
    with FileSystems.create(part) as f:
        f.write(text.encode("utf-8"))
    return chunk, part


def concatenate_parts(path: str, parts: Iterable[tuple[tuple[str, int], str]]) -> str:
    """Appends the parts, in chunk order, into `path` (empty if none). The parts stay: a retried
    bundle concatenates them again, and they go with the run's staging folder."""
    ordered = [part for _, part in sorted(parts)]
    with gcs.create(path) as out:
        for part in ordered:
            with gcs.open_read(part, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                while block := f.read(_BLOCK_BYTES):
                    out.write(block)
    return path
