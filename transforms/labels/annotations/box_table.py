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

from transforms.labels.annotations.rows import class_name, schema
from transforms.labels.table import normalize_keys

BOX_UNITS = ("pixels", "normalized")
# Distinct label cells whose class names a BoxRows keeps (Open Images has 600 classes).
_MAX_NAMES = 100_000
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
    """The column as float64 (null where a cell is no finite number: blank, text, NaN,
    infinity), and where that is."""
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        try:  # the usual case, a column of plain numbers: one cast
            column = pc.cast(column, pa.float64())
        except pa.ArrowInvalid:  # some cell is not (blanks around a number are allowed)
            cells = pc.utf8_trim_whitespace(_text(column))
            good = pc.fill_null(pc.match_substring_regex(cells, _NUMBER), False)
            column = pc.if_else(good, pc.cast(pc.if_else(good, cells, "0"), pa.float64()), None)
    values = pc.cast(column, pa.float64())
    values = pc.if_else(pc.fill_null(pc.is_finite(values), False), values, None)
    return values, pc.is_null(values).to_numpy(zero_copy_only=False)


class BoxRows:
    """Converts the batches of one box table to rows (see the module docstring); holds the
    class names of up to _MAX_NAMES distinct label cells, so a table's few hundred classes
    are checked once, not once a batch."""

    def __init__(self, table: BoxTable):
        self.table = table
        self._schema = schema(table.units == "normalized")
        self._names: dict[str, tuple[str | None, str | None]] = {}  # cell -> class_name(cell)

    def __call__(self, cells: pa.RecordBatch | pa.Table, source: str, lines: pa.Array) -> pa.RecordBatch:
        """The rows of one batch: an object row per record, a failure row per bad one.

        Args:
          cells: the batch's columns by header name (at least table.required_columns()).
          source: the table file; lines: each record's line in it (from 1).
        """
        table = self.table
        if isinstance(cells, pa.Table):
            cells = pa.RecordBatch.from_arrays(
                [c.combine_chunks() for c in cells.columns], schema=cells.schema
            )
        n = cells.num_rows
        keys = normalize_key_column(_text(cells.column(table.key_column)))
        labels, label_problems = self._labels(_text(cells.column(table.label_column)))
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
        columns = {
            "key": pc.if_else(pa.array(no_key), None, keys),
            "label": labels,
            "xmin": corners[0],
            "ymin": corners[1],
            "xmax": corners[2],
            "ymax": corners[3],
            "is_crowd": falses,
            "difficult": falses,
            "truncated": falses,
            "source": pa.repeat(pa.scalar(source, pa.string()), n),
            "line": lines,
            "error": pa.array(errors, pa.string()),
        }
        arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in self._schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _labels(self, cells: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        """The class names of a label column (rows.class_name of each distinct cell), and per
        row why its cell is no class name (null where it is one; None when every row has one)."""
        coded = cells.dictionary_encode()
        distinct = coded.dictionary.to_pylist()
        if len(self._names) + len(distinct) > _MAX_NAMES:
            self._names.clear()
        names = self._names
        found = [names.get(cell) or names.setdefault(cell, class_name(cell)) for cell in distinct]
        labels = pa.array([name for name, _ in found], pa.string()).take(coded.indices)
        if cells.null_count == 0 and not any(problem for _, problem in found):
            return labels, None
        problems = pa.array([problem for _, problem in found], pa.string()).take(coded.indices)
        return labels, pc.if_else(pc.is_null(cells), pa.scalar("the class name is empty"), problems)


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
