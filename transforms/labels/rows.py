"""The labels table's records (pure): its spec, rows (Arrow columns, LabelRow), label maps,
join settings, and the names of the flags' choices. Rows, images and orphans travel as pyarrow
RecordBatches with the columns named here (ROW_COLUMNS, FILE_COLUMNS, ORPHAN_COLUMNS; extras
as EXTRA_PREFIX + name); LabelRow is one row as Python values (join.join_key, tests).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

FORMATS = ("csv", "tsv", "jsonl")
_FORMAT_OF_SUFFIX = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".deflate")
IMAGE_KEYS = ("stem", "name", "relpath")
UNLABELED_POLICIES = ("fail", "skip", "keep")
DUPLICATE_POLICIES = ("fail", "first", "union")
LABEL_TYPES = ("auto", "int", "str")
EXTRA_TYPES = ("int", "float", "str")
ORPHANS_FILE = "orphan_labels.jsonl"
STAGE = "label"

# Tagged outputs of JoinLabelsFn (FAILED comes from transforms.failures).
ORPHANS, STATS, LISTED = "orphans", "stats", "listed"

# Counts reported under "labels" in summary.json (always present, 0 when nothing happened).
STAT_NAMES = tuple(
    "rows matched_rows orphan_rows invalid_rows duplicate_keys conflicting_keys keys_with_several_images "
    "unlabeled_images unlabeled_skipped unlabeled_kept".split()
)

_SPLIT_NAME = re.compile(r"\w[\w.-]*")

# The columns of a batch of table rows: the join key (binary: UTF-8, surrogates passed), the
# row's labels joined by LABEL_SEP ("" = none; a control character is never inside a label),
# its split (null = none), why it cannot be used (null = it can), where it is (source as a
# dictionary: one file a batch), then the extra columns, typed, as EXTRA_PREFIX + name.
KEY, LABELS, SPLIT, ERROR, SOURCE, LINE = "key", "labels", "split", "error", "source", "line"
ROW_COLUMNS = (KEY, LABELS, SPLIT, ERROR, SOURCE, LINE)
LABEL_SEP = "\x1f"
EXTRA_PREFIX = "extra:"
_EXTRA_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
# The columns of a batch of listed images: key, the listing root (a dictionary: one value a
# batch as a rule), the path (null where it is root + relpath), relpath, size. Text as binary.
ROOT, PATH, RELPATH, SIZE = "root", "path", "relpath", "size"
FILE_COLUMNS = (KEY, ROOT, PATH, RELPATH, SIZE)
# The columns of a batch of orphan rows (join.orphans_of): a row's reason, and its key's first
# row when the key has several (null: the row itself). Written by output/orphan_log.py.
REASON, FIRST_SOURCE, FIRST_LINE = "reason", "first_source", "first_line"
ORPHAN_COLUMNS = (KEY, SOURCE, LINE, REASON, FIRST_SOURCE, FIRST_LINE)
NO_IMAGE = "no image with this key"
_SOURCE_TYPE = pa.dictionary(pa.int32(), pa.string())
_ROOT_TYPE = pa.dictionary(pa.int32(), pa.binary())


class TableError(ValueError):
    """The table as a whole cannot be read (missing column, not UTF-8, not CSV)."""


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """Where the labels table is (a file or glob, local or gs://), its format (FORMATS), its
    text encoding and delimiter ('' = the format's), and which columns mean what: `separator`
    splits a label cell ('' = never), `split_column` ('' = none), `extra_columns` ((column,
    type) pairs carried into the Example)."""

    path: str
    format: str
    key_column: str = "id"
    label_column: str = "label"
    separator: str = "|"
    split_column: str = ""
    extra_columns: tuple[tuple[str, str], ...] = ()
    encoding: str = "utf-8"
    delimiter: str = ""

    def required_columns(self) -> tuple[str, ...]:
        split = (self.split_column,) if self.split_column else ()
        return (self.key_column, self.label_column, *split, *(name for name, _ in self.extra_columns))

    def csv_delimiter(self) -> str:
        return self.delimiter or ("\t" if self.format == "tsv" else ",")

    def schema(self) -> pa.Schema:
        """The columns of this table's row batches."""
        extras = [(EXTRA_PREFIX + name, _EXTRA_ARROW_TYPES[kind]) for name, kind in self.extra_columns]
        return row_schema(extras)


def row_schema(extras: Sequence[tuple[str, pa.DataType]] = ()) -> pa.Schema:
    types = (pa.binary(), pa.string(), pa.string(), pa.string(), _SOURCE_TYPE, pa.int64())
    return pa.schema([*zip(ROW_COLUMNS, types), *extras])


def file_schema() -> pa.Schema:
    return pa.schema(list(zip(FILE_COLUMNS, (pa.binary(), _ROOT_TYPE, pa.binary(), pa.binary(), pa.int64()))))


def encode_text(values: Sequence[str]) -> pa.Array:
    """Text as a binary column: UTF-8, undecodable file names' surrogates passed through."""
    try:
        return pa.array(values, pa.string()).view(pa.binary())
    except (UnicodeEncodeError, pa.ArrowException):
        return pa.array([v.encode("utf-8", "surrogatepass") for v in values], pa.binary())


def decode_text(column: pa.Array | pa.ChunkedArray) -> list[str]:
    """A binary column of encode_text as Python strings."""
    try:
        return column.cast(pa.string()).to_pylist()
    except pa.ArrowInvalid:
        return [None if v is None else v.decode("utf-8", "surrogatepass") for v in column.to_pylist()]


def text_bytes(column: pa.Array) -> bytes:
    """The values of a text or binary column, back to back."""
    if not len(column) or column.buffers()[2] is None:
        return b""
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    return column.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]


def source_column(source: str, n: int) -> pa.DictionaryArray:
    """`n` rows of one file: its name once, an index a row."""
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([source], pa.string()))


def root_column(root: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), encode_text([root]))


class LabelRow(NamedTuple):
    """One row of the table as Python values (a row that cannot be used carries `error`)."""

    key: str
    labels: tuple[str, ...] = ()
    split: str | None = None
    extras: tuple[tuple[str, object], ...] = ()
    source: str = ""
    line: int = 0
    error: str | None = None

    def content(self) -> tuple:
        """What the row says about its image (two rows saying the same are duplicates)."""
        return self.labels, self.split, self.extras

    def where(self) -> str:
        return f"{self.source}:{self.line}"


def rows_batch(rows: Iterable[LabelRow], spec: TableSpec | None = None) -> pa.RecordBatch:
    """LabelRows as one batch of ROW_COLUMNS (extras typed by `spec`, else by their values)."""
    rows = list(rows)
    names = (
        [n for n, _ in spec.extra_columns]
        if spec
        else list(dict.fromkeys(n for r in rows for n, _ in r.extras))
    )
    columns = [
        encode_text([r.key for r in rows]),
        pa.array([LABEL_SEP.join(r.labels) for r in rows], pa.string()),
        *(pa.array(values, pa.string()) for values in ([r.split for r in rows], [r.error for r in rows])),
        pa.array([r.source for r in rows], pa.string()).dictionary_encode().cast(_SOURCE_TYPE),
        pa.array([r.line for r in rows], pa.int64()),
    ]
    schema = spec.schema() if spec else None
    for name in names:
        kind = schema.field(EXTRA_PREFIX + name).type if schema else None
        columns.append(pa.array([dict(r.extras).get(name) for r in rows], kind))
    schema = schema or row_schema([(EXTRA_PREFIX + n, c.type) for n, c in zip(names, columns[6:])])
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def extra_names(table: pa.Table | pa.RecordBatch) -> list[str]:
    """The extra columns of a batch of rows (their Example feature names)."""
    return [n.removeprefix(EXTRA_PREFIX) for n in table.schema.names if n.startswith(EXTRA_PREFIX)]


def label_rows(table: pa.Table | pa.RecordBatch) -> list[LabelRow]:
    """The rows of a batch as LabelRows (one object a row: the keys a policy decides, tests)."""
    if not table.num_rows:
        return []
    names = extra_names(table)
    extras = [table.column(EXTRA_PREFIX + n).to_pylist() for n in names]
    errors = table.column(ERROR).to_pylist()
    extras = [tuple((n, v) for n, v in zip(names, values) if v is not None) for values in zip(*extras)]
    extras = [() if error else row for row, error in zip(extras or [()] * table.num_rows, errors)]
    labels = [tuple(t.split(LABEL_SEP)) if t else () for t in table.column(LABELS).to_pylist()]
    keys, splits = decode_text(table.column(KEY)), table.column(SPLIT).to_pylist()
    sources, lines = table.column(SOURCE).cast(pa.string()).to_pylist(), table.column(LINE).to_pylist()
    return list(map(LabelRow, keys, labels, splits, extras, sources, lines, errors))


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """The classes of --label_map: names in id order (labels.txt and the TFDS ClassLabel
    names), `names[i]` having id `first_id + i` (the smallest id of an id,name table, else
    --label_offset)."""

    names: tuple[str, ...]
    first_id: int = 0

    def find(self, label: str) -> str | None:
        """The class a table label stands for: a name stands for itself, an id (as text, '007'
        too) for its name unless that text is itself a name; None if neither."""
        if label in self._index:
            return label
        if label.isascii() and label.isdigit():
            if str(int(label)) in self._index:  # '007' for a class named '7'
                return str(int(label))
            at = int(label) - self.first_id
            if 0 <= at < len(self.names):
                return self.names[at]
        return None

    @functools.cached_property
    def _index(self) -> frozenset[str]:
        return frozenset(self.names)


@dataclasses.dataclass(frozen=True)
class JoinSettings:
    """How JoinLabels turns rows into labelled records: --unlabeled (an image without a
    label row), --duplicate_keys (rows of one key that disagree), --label_type ('int' makes
    non-integer labels failures), --label_map (other labels fail), and whether the split is
    the first folder of the image's path."""

    unlabeled: str = "fail"
    duplicates: str = "fail"
    label_type: str = "auto"
    label_map: LabelMap | None = None
    split_from_folders: bool = False
