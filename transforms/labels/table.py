"""Reading a labels table file (pure): its format, its rows as Arrow batches, and the checks
made on the submitting machine before the run.

In: a table file or glob (CSV, TSV or JSON Lines; local or gs://; plain or compressed), read as
a stream. Out: Arrow batches of rows.ROW_COLUMNS (iter_row_batches: table_csv.py, or JSON Lines
here, over text.Utf8Stream, the cells by cells.py), or a TableError in one line.

JSON Lines: a line at a time under text.LINE_CAP (bounded_lines: a line of 2 GiB is refused
once 4 MiB of it are read, as pyarrow.csv refuses such a record), each parsed by the json module
and cells.parse_row; pyarrow.json would refuse a field whose type changes from line to line (a
label as text, then a list) and stop at the first line that is not JSON instead of naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import stat
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.gcs import literal_or_glob
from transforms.labels import table_csv
from transforms.labels.cells import (  # noqa: F401 - the rules of cells, read from here too
    FIELD_LIMIT,
    check_header,
    convert_extra,
    image_key,
    image_keys,
    normalize_key,
    normalize_keys,
    parse_row,
    split_labels,
)
from transforms.labels.rows import (
    _COMPRESSED_SUFFIXES,
    _FORMAT_OF_SUFFIX,
    EXTRA_TYPES,
    FORMATS,
    LabelRow,
    TableError,
    TableSpec,
    label_rows,
    rows_batch,
)
from transforms.labels.text import Utf8Stream, bounded_lines


def detect_format(path: str, fmt: str = "auto") -> str:
    """The table format: `fmt` if given, else from the suffix (.csv, .tsv, .jsonl, +.gz); ValueError if unknown."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ValueError(f"--labels_format must be one of auto, {', '.join(FORMATS)}")
        return fmt
    name = path.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    found = _FORMAT_OF_SUFFIX.get(posixpath.splitext(name)[1])
    if found is None:
        raise ValueError(
            f"--labels {path}: cannot tell the format from the name; pass --labels_format csv|tsv|jsonl"
        )
    return found


def parse_extra_columns(spec: str) -> tuple[tuple[str, str], ...]:
    """'weight:float,source:str' as (('weight', 'float'), ('source', 'str')); ValueError if malformed."""
    if not spec.strip():
        return ()
    out: list[tuple[str, str]] = []
    for part in spec.split(","):
        name, sep, kind = part.strip().rpartition(":")
        name, kind = name.strip(), kind.strip()
        if not sep or not name:
            raise ValueError(f"--extra_columns: expected name:type, got {part.strip()!r}")
        if kind not in EXTRA_TYPES:
            raise ValueError(f"--extra_columns: type of {name!r} must be one of {', '.join(EXTRA_TYPES)}")
        out.append((name, kind))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError("--extra_columns: a column is named twice")
    return tuple(out)


ROWS_PER_BATCH = 50_000


def _row(number: int, raw: bytes, spec: TableSpec, source: str) -> LabelRow | None:
    if not raw.strip():
        return None
    try:
        obj = json.loads(raw)
    except ValueError as e:
        return LabelRow(key="", source=source, line=number, error=f"not JSON: {e}")
    if not isinstance(obj, dict):
        return LabelRow(key="", source=source, line=number, error="not a JSON object")
    long = next((k for k, v in obj.items() if isinstance(v, str) and len(v) > FIELD_LIMIT), None)
    if long is not None:
        raise TableError(
            f"labels table {source} line {number}: field larger than field limit ({FIELD_LIMIT})"
        )
    return parse_row(obj, spec, source, number)


def jsonl_batches(stream: Utf8Stream, spec: TableSpec, source: str) -> Iterator[pa.RecordBatch]:
    """The rows of a JSON Lines table (see the module docstring)."""
    rows: list[LabelRow] = []
    for number, raw in bounded_lines(stream, source):
        row = _row(number, raw, spec, source)
        if row is not None:
            rows.append(row)
        if len(rows) >= ROWS_PER_BATCH:
            yield rows_batch(rows, spec)
            rows = []
    if rows:
        yield rows_batch(rows, spec)


def first_object_keys(stream: Utf8Stream, source: str) -> list[str]:
    """The field names of the first JSON object of a table (TableError if it is not one)."""
    for _, raw in bounded_lines(stream, source):
        if raw.strip():
            try:
                return list(json.loads(raw).keys())
            except (ValueError, AttributeError):
                raise TableError(f"labels table {source}: the first line is not a JSON object") from None
    raise TableError(f"labels table {source} is empty")


def iter_row_batches(f: BinaryIO, spec: TableSpec, source: str = "") -> Iterator[pa.RecordBatch]:
    """The rows of a table file (read as a stream), as Arrow batches of ROW_COLUMNS in file
    order (a block of records at a time; rows pyarrow rejects follow their block's batch).

    CSV and TSV (table_csv.py): a header row, RFC 4180 quoting (fields may hold the delimiter,
    quotes and line breaks), CRLF, LF or CR line ends. JSON Lines: one object a
    line. A row's line is the line (from 1, split at '\\n') its record starts on. Raises
    TableError: the text is not `spec.encoding` (UTF-8 unless given), the header lacks a
    required column, a record or line over text.LINE_CAP, a field over FIELD_LIMIT characters,
    a quoted field never closed.
    """
    stream = Utf8Stream(f, source, spec.encoding)
    reader = jsonl_batches if spec.format == "jsonl" else table_csv.csv_batches
    yield from reader(stream, spec, source)


def iter_table(f: BinaryIO, spec: TableSpec, source: str = "") -> Iterator[LabelRow]:
    """The rows of a table file one LabelRow each (for tests and the up-front key check)."""
    for batch in iter_row_batches(f, spec, source):
        yield from label_rows(batch)


def read_header(path: str, spec: TableSpec) -> list[str]:
    """The column names of a table file: the CSV header, or the keys of the first JSON line
    (TableError: not text in its encoding, over the caps; OSError if unreadable)."""
    with gcs.open_read(path) as f:
        stream = Utf8Stream(f, path, spec.encoding)
        if spec.format == "jsonl":
            return first_object_keys(stream, path)
        return table_csv.read_header(stream, spec, path)[0]


def check_regular_file(path: str) -> None:
    """TableError unless a local table is a regular file: a pipe (`<(zcat t.csv.gz)`) or a
    device would hang the open, or be read up by the header check before the pipeline."""
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the open that follows names the problem
    if not stat.S_ISREG(mode):
        raise TableError(
            f"--labels {path} is not a regular file (a pipe or a device): save the table to a file first"
        )


def _list_error(error: Exception) -> str:
    """The store's own answer inside a (possibly twice wrapped) filesystem error, in one line."""
    while isinstance(getattr(error, "exception_details", None), dict) and error.exception_details:
        error = next(iter(error.exception_details.values()))
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def check_table(spec: TableSpec) -> list[str]:
    """The matched paths, after cheap checks on the submitting machine (the start of each: its
    text and header): TableError for no such file, a listing that fails (naming the store's
    error), not a regular file, not text in its encoding, or a missing column."""
    try:
        found = FileSystems.match([literal_or_glob(spec.path)])[0].metadata_list
    except (BeamIOError, *gcs.ERRORS) as e:
        raise TableError(f"--labels {spec.path}: cannot list: {_list_error(e)}") from None
    paths = sorted(m.path for m in found)
    if not paths:
        raise TableError(f"--labels {spec.path}: no such file")
    for path in paths:
        check_regular_file(path)
        try:
            header = read_header(path, spec)
        except OSError as e:
            raise TableError(f"--labels {path}: cannot read: {e}") from None
        if spec.format != "jsonl":
            check_header(header, spec, path)
            continue
        key_and_label = dataclasses.replace(spec, split_column="", extra_columns=())
        check_header(header, key_and_label, f"{path} (its first object)", "field")
    return paths
