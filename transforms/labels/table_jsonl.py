"""JSON Lines tables (pure): one JSON object a line, into batches of rows.

In: a table's text (text.Utf8Stream), a line at a time under text.LINE_CAP (bounded_lines: a
line of 2 GiB is refused once 4 MiB of it are read, as the CSV reader refuses such a record).
Out: Arrow batches of rows.ROW_COLUMNS, ROWS_PER_BATCH lines a batch. Each line is parsed by the
json module and table.parse_row: pyarrow.json would refuse a field whose type changes from line
to line (a label as text, then a list) and stop at the first line that is not JSON instead of
naming it in its row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa

from transforms.labels.cells import FIELD_LIMIT, parse_row
from transforms.labels.rows import LabelRow, TableError, TableSpec, rows_batch
from transforms.labels.text import Utf8Stream, bounded_lines

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
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                raise TableError(f"labels table {source}: the first line is not a JSON object")
            return list(obj)
    raise TableError(f"labels table {source} is empty")
