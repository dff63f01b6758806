"""WriteOrphans: the Beam shell of orphan_labels.jsonl (orphan_log.py).

In: Arrow batches of orphan rows (one per join bucket, JoinLabels.orphans) and the join's
counts. Out: orphan_labels.jsonl in the staging folder, and the "labels" section of
summary.json. Bounds: see WriteOrphans.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.labels.rows import ORPHANS, ORPHANS_FILE, STATS, JoinSettings, TableSpec
from transforms.output.orphan_log import label_summary, orphan_chunks, orphan_lines

# Bytes copied at a time when the parts are appended.
_COPY_BYTES = 4 << 20


class WriteOrphans(beam.PTransform):
    """Writes orphan rows to <output_dir>/orphan_labels.jsonl; returns the summary section.

    Never one list of all orphans: the join's batches are cut by the chunk of table lines where
    their key's first row is (orphan_log.CHUNK_LINES of a file's lines: a group holds the orphan
    rows of the keys first seen there, at most one batch per join bucket), each group sorted
    and written as a part (orphan_log.orphan_lines); one step appends the parts in
    order (streamed; its side input is one path per chunk). The returned singleton
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
            | "ByChunk"
            >> beam.FlatMap(orphan_chunks).with_output_types(
                beam.typehints.Tuple[beam.typehints.Tuple[str, int], pa.RecordBatch]
            )
            | "GroupByChunk" >> beam.GroupByKey()  # ((source, chunk), [Arrow batch of orphan rows])
            | "WriteParts" >> beam.MapTuple(lambda chunk, batches: write_orphan_part(chunk, batches, path))
        )  # (chunk, part path)
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


def write_orphan_part(chunk: tuple[str, int], batches: Iterable[pa.RecordBatch], path: str) -> tuple:
    """Writes one chunk's orphan rows, sorted, beside `path`; returns (chunk, part path)."""
    digest = zlib.crc32(chunk[0].encode("utf-8", "surrogateescape"))
    part = f"{path}.part-{digest:08x}-{chunk[1]:06d}"
    with FileSystems.create(part) as f:
        f.write(orphan_lines(pa.Table.from_batches(list(batches))))
    return chunk, part


def concatenate_parts(path: str, parts: Iterable[tuple[tuple[str, int], str]]) -> str:
    """Appends the parts, in chunk order, into `path` (empty if none). The parts stay: a retried
    bundle concatenates them again, and they go with the run's staging folder."""
    ordered = [part for _, part in sorted(parts)]
    with gcs.create(path) as out:
        for part in ordered:
            with gcs.open_read(part, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                while block := f.read(_COPY_BYTES):
                    out.write(block)
    return path
