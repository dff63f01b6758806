"""The rows every annotation reader yields (pure): one pyarrow schema for COCO, VOC, YOLO,
segmentation maps and box tables, so that everything after the labels join is format-blind.

A row is one object (a box with its class and flags), or an image-only row (null label, null
box: "this image exists in the annotations", a background image when it has no object row),
or a failure row (`error` set: a record that cannot be used, named by `source` and `line`; a
row with a key fails that key's image, one without a key is reported on its own). Rows of one
key gather into one `Objects` record (what the labels stage hands the writer), the object
rows in `line` order (their order in the file); image-only rows add no object, only the
declared size or the map.

Whether boxes are fractions of the image (YOLO, `--box_units normalized`) or pixels is one
setting of the reader, carried as the schema's metadata (`normalized`), not a column.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Iterator

import pyarrow as pa

from transforms.labels.folders import class_name_problem

# The formats with a reader in this package (--labels_format); the tables are labels/table.py's.
COCO, VOC, YOLO, SEGMENTATION = "coco", "voc", "yolo", "segmentation"
ANNOTATION_FORMATS = (COCO, VOC, YOLO, SEGMENTATION)

# Schema metadata: b"1" when boxes are fractions of the image size, b"0" when pixels.
NORMALIZED = b"normalized"

FIELDS = (
    # The image as the annotation names it (COCO file_name, VOC filename, a YOLO or PNG file's
    # stem, a table's key), NFC and '/'-separated; null where not known (a COCO annotation
    # before its image is attached, a file that could not be parsed).
    pa.field("key", pa.string()),
    pa.field("label", pa.string()),  # class name; null on image-only rows
    # Box corners, continuous coordinates (pixel column 0 spans 0..1): pixels, or fractions.
    pa.field("xmin", pa.float64()),
    pa.field("ymin", pa.float64()),
    pa.field("xmax", pa.float64()),
    pa.field("ymax", pa.float64()),
    pa.field("is_crowd", pa.bool_()),
    pa.field("difficult", pa.bool_()),
    pa.field("truncated", pa.bool_()),
    pa.field("area", pa.float64()),  # as the annotation gives it; null: absent
    pa.field("mask", pa.binary()),  # COCO segmentation as compact JSON text (polygons or RLE)
    pa.field("declared_width", pa.int32()),  # the size the annotation declares; null: none
    pa.field("declared_height", pa.int32()),
    pa.field("segmentation_path", pa.string()),  # a PNG class map beside the image
    pa.field("image_id", pa.int64()),  # COCO's image id (joins annotations to images); else null
    pa.field("source", pa.string()),  # the annotation file
    # Where in it, from 1: the text line (YOLO, tables), the object's place (VOC), the place
    # in COCO's `images` or `annotations` array. Orders a key's objects.
    pa.field("line", pa.int64()),
    pa.field("error", pa.string()),  # why the record cannot be used; null: it can
)
NAMES = tuple(f.name for f in FIELDS)
_PIXELS = pa.schema(FIELDS, metadata={NORMALIZED: b"0"})
_FRACTIONS = pa.schema(FIELDS, metadata={NORMALIZED: b"1"})


def schema(normalized: bool = False) -> pa.Schema:
    """The row schema, with boxes in pixels or (normalized) fractions of the image."""
    return _FRACTIONS if normalized else _PIXELS


def is_normalized(rows: pa.RecordBatch | pa.Table) -> bool:
    """True when the rows' boxes are fractions of the image size (the schema's metadata)."""
    return (rows.schema.metadata or {}).get(NORMALIZED) == b"1"


class AnnotationError(ValueError):
    """The annotation input as a whole cannot be read (not JSON, not the format, no such
    file): the run is refused in one line before it starts, or stops with that line."""


class RowBuilder:
    """Collects rows a column at a time and hands them over as RecordBatches of `size` rows.

    `add` takes one row (about a microsecond: a list append a column); `batches` yields the
    full batches made so far and `flush` the rest, so a reader holds at most `size` rows.
    """

    def __init__(self, source: str = "", normalized: bool = False, size: int = 1000):
        self.source, self.size = source, size
        self._schema = schema(normalized)
        self._columns: list[list] = [[] for _ in FIELDS]

    def __len__(self) -> int:
        return len(self._columns[0])

    def add(
        self,
        key: str | None,
        label: str | None = None,
        box: tuple[float, float, float, float] | None = None,
        *,
        is_crowd: bool = False,
        difficult: bool = False,
        truncated: bool = False,
        area: float | None = None,
        mask: bytes | None = None,
        declared: tuple[int, int] | None = None,
        segmentation_path: str | None = None,
        image_id: int | None = None,
        line: int = 0,
        error: str | None = None,
        source: str | None = None,
    ) -> None:
        """One row. An object row has a label and a box; an image-only row neither (its flags
        are then null); a failure row has `error` (its other fields as far as they are known)."""
        c = self._columns
        obj = box is not None
        c[0].append(key)
        c[1].append(label)
        for i, v in enumerate(box or (None, None, None, None)):
            c[2 + i].append(v)
        c[6].append(is_crowd if obj else None)
        c[7].append(difficult if obj else None)
        c[8].append(truncated if obj else None)
        c[9].append(area)
        c[10].append(mask)
        c[11].append(declared[0] if declared else None)
        c[12].append(declared[1] if declared else None)
        c[13].append(segmentation_path)
        c[14].append(image_id)
        c[15].append(self.source if source is None else source)
        c[16].append(line)
        c[17].append(error)

    def fail(
        self, key: str | None, line: int, error: str, *, image_id: int | None = None, source=None
    ) -> None:
        """A failure row: the record at `line` cannot be used, because `error`."""
        self.add(key, image_id=image_id, line=line, error=error, source=source)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The full batches of `size` rows collected so far (taken out of the builder)."""
        while len(self) >= self.size:
            yield self._take(self.size)

    def flush(self) -> Iterator[pa.RecordBatch]:
        """Every row still held, as batches of up to `size` rows."""
        yield from self.batches()
        if len(self):
            yield self._take(len(self))

    def _take(self, n: int) -> pa.RecordBatch:
        arrays = [pa.array(column[:n], type=f.type) for column, f in zip(self._columns, FIELDS)]
        for column in self._columns:
            del column[:n]
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def empty(normalized: bool = False) -> pa.RecordBatch:
    """A batch of no rows (the schema alone)."""
    return pa.RecordBatch.from_pylist([], schema=schema(normalized))


def class_name(text: object) -> tuple[str | None, str | None]:
    """(name, None) for a usable class name as an annotation gives it (spaces stripped, NFC),
    else (None, why): names go into labels.txt one a line, as folder and table labels do."""
    if not isinstance(text, str):
        return None, f"class name {text!r} is not text"
    name = unicodedata.normalize("NFC", text.strip())
    if not name:
        return None, "the class name is empty"
    problem = class_name_problem(name)
    return (None, f"class name {name!r} {problem}") if problem else (name, None)


def finite(values: Iterable[object]) -> tuple[float, ...] | None:
    """The values as floats if every one is a finite number (not a bool), else None."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        f = float(v)
        if not math.isfinite(f):
            return None
        out.append(f)
    return tuple(out)
