"""The box columns of a labels table as annotation rows (pure, a batch of columns at a time).

In: a batch of a CSV, TSV or JSON Lines labels table as the table reader parses it (a
pyarrow RecordBatch of the table's columns by header name: text cells, or numbers for
JSON Lines), with each record's line; `--box_columns` names the four coordinate columns in
the order xmin, ymin, xmax, ymax (Open Images: `XMin,YMin,XMax,YMax`), `--box_units` says
whether they are pixels or fractions of the image. Out: one object row (rows.py) per table
row, in table order, keyed and labelled by the key and label columns: a 15 M-box table
(Open Images) becomes rows the columnar join gathers by key, as a table of one label a row.

Everything is computed for the batch's columns at once with pyarrow.compute (the key and
label normalised as labels/table.py normalises them, the numbers cast); a Python call is made
only for a distinct label (its name check) and for a bad row (its message). A row with an
empty key, an empty label, or a coordinate that is not a finite number is a failure row
naming its line and column. One label a box: a label cell is one class name.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.labels.annotations.rows import NAMES, class_name, schema
from transforms.labels.table import normalize_keys

BOX_UNITS = ("pixels", "normalized")
# A finite decimal number as text (what pyarrow's cast to float64 reads; no nan, inf, blanks).
_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


@dataclasses.dataclass(frozen=True)
class BoxTable:
    """Which columns of a labels table hold what: the key, the label, and the box corners
    (xmin, ymin, xmax, ymax), in `units` (BOX_UNITS)."""

    key_column: str
    label_column: str
    box_columns: tuple[str, str, str, str]
    units: str = "pixels"

    def required_columns(self) -> tuple[str, ...]:
        return (self.key_column, self.label_column, *self.box_columns)


def parse_box_columns(spec: str) -> tuple[str, str, str, str]:
    """'XMin,YMin,XMax,YMax' as four column names; ValueError unless four distinct names."""
    names = tuple(part.strip() for part in spec.split(","))
    if len(names) != 4 or not all(names):
        raise ValueError(f"--box_columns: expected four columns xmin,ymin,xmax,ymax, got {spec!r}")
    if len(set(names)) != 4:
        raise ValueError(f"--box_columns: a column is named twice in {spec!r}")
    return names  # type: ignore[return-value]


def normalize_key_column(column: pa.Array) -> pa.Array:
    """labels/table.py `normalize_key` of every key of a text column, once per distinct key
    (Open Images has ~7 boxes an image). Not pyarrow's utf8_normalize: pyarrow 25's "NFC"
    decomposes 'é' (tests/labels/annotations/test_box_table.py checks against normalize_key)."""
    coded = column.dictionary_encode()
    return pa.array(normalize_keys(coded.dictionary.to_pylist()), pa.string()).take(coded.indices)


def _text(column: pa.Array) -> pa.Array:
    return column if pa.types.is_string(column.type) else pc.cast(column, pa.string())


def _numbers(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The column as float64, and where a cell is not a finite number (blank, text, NaN)."""
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        values = pc.cast(column, pa.float64())
        bad = pc.invert(pc.fill_null(pc.is_finite(values), False))
        return values, bad.to_numpy(zero_copy_only=False)
    cells = pc.utf8_trim_whitespace(_text(column))
    good = pc.fill_null(pc.match_substring_regex(cells, _NUMBER), False)
    values = pc.cast(pc.if_else(good, cells, "0"), pa.float64())
    values = pc.if_else(pc.and_(good, pc.is_finite(values)), values, pa.scalar(None, pa.float64()))
    return values, pc.is_null(values).to_numpy(zero_copy_only=False)


def box_rows(
    cells: pa.RecordBatch | pa.Table, table: BoxTable, source: str, lines: pa.Array
) -> pa.RecordBatch:
    """The rows of one batch of a box table: an object row per record, a failure row per bad one.

    Args:
      cells: the batch's columns by header name (at least table.required_columns()).
      source: the table file; lines: each record's line in it (from 1).
    """
    n = cells.num_rows
    keys = normalize_key_column(_text(cells.column(table.key_column)))
    labels, label_problems = _labels(_text(cells.column(table.label_column)))
    corners, bad_corner = [], []
    for name in table.box_columns:
        values, bad = _numbers(cells.column(name))
        corners.append(values)
        bad_corner.append(bad)
    lines = pc.cast(pa.array(lines), pa.int64())
    no_key = pc.fill_null(pc.equal(keys, ""), True).to_numpy(zero_copy_only=False)
    bad_label = np.zeros(n, bool) if label_problems is None else label_problems.is_valid().to_numpy(False)
    errors: list[str | None] = [None] * n
    for j in np.flatnonzero(no_key | bad_label | np.any(bad_corner, axis=0)).tolist():
        errors[j] = _row_problem(j, lines[j].as_py(), no_key, label_problems, bad_corner, table, cells)
    falses = pa.array(np.zeros(n, bool))
    nulls = {name: pa.nulls(n, field.type) for name, field in zip(NAMES, schema())}
    columns = {
        **nulls,
        "key": pc.if_else(pa.array(no_key), pa.scalar(None, pa.string()), keys),
        "label": labels,
        "xmin": corners[0],
        "ymin": corners[1],
        "xmax": corners[2],
        "ymax": corners[3],
        "is_crowd": falses,
        "difficult": falses,
        "truncated": falses,
        "source": pa.array([source] * n, pa.string()),
        "line": lines,
        "error": pa.array(errors, pa.string()),
    }
    out_schema = schema(table.units == "normalized")
    return pa.RecordBatch.from_arrays([columns[name] for name in NAMES], schema=out_schema)


def _labels(cells: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """The class names of a label column (rows.class_name of each distinct cell), and per row
    why its cell is no class name (null where it is one; None when every row has one)."""
    coded = cells.dictionary_encode()
    found = [class_name(v) for v in coded.dictionary.to_pylist()]
    names = pa.array([name for name, _ in found], pa.string()).take(coded.indices)
    if not any(problem for _, problem in found) and cells.null_count == 0:
        return names, None
    problems = pa.array([problem for _, problem in found], pa.string()).take(coded.indices)
    return names, pc.if_else(pc.is_null(cells), pa.scalar("the class name is empty"), problems)


def _row_problem(j, line, no_key, label_problems, bad_corner, table: BoxTable, cells) -> str:
    """The failure message of row j (the first of its problems)."""
    if no_key[j]:
        return f"line {line}: no value in key column {table.key_column!r}"
    if label_problems is not None and label_problems[j].is_valid:
        return f"line {line}: column {table.label_column!r}: {label_problems[j].as_py()}"
    for name, bad in zip(table.box_columns, bad_corner):
        if bad[j]:
            return f"line {line}: column {name!r}: {cells.column(name)[j].as_py()!r} is not a finite number"
    raise AssertionError("a row without a problem")
