"""The labels table and the images' keys as columns (pure): no Python object per row.

In: a table file's bytes (as table.iter_table reads them), or the relpaths of listed images.
Out: LabelRows (the rows' fields as seven columns, up to BATCH_SIZE rows a batch, in file
order), or the images' join keys.

A plain block (no quotes, every line with the header's number of fields) is cut into cells
by two string splits, and each column is checked and converted for the whole block at once:
keys normalized only if the block holds a key that needs it, label and split cells parsed
once per distinct value, extra columns converted by one map over the column. A block that
has anything else (a blank line, a short row, an empty key, a bad label, split or extra
value) is parsed line by line by table.py, which names each bad row: the two ways give the
same rows (tests/labels/test_label_table.py compares them).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter, methodcaller

from transforms.labels.rows import LabelRow, LabelRows, TableSpec
from transforms.labels.table import (
    _CACHE_SIZE,
    _FIELD_LIMIT,
    _check_split,
    _delimiter,
    _RowBuilder,
    iter_table,
    normalize_key,
    split_labels,
)
from transforms.records import BATCH_SIZE

_LEADING_DOTS = methodcaller("lstrip", ".")
_LAST_DOT = methodcaller("rpartition", ".")
_LAST_SLASH = methodcaller("rpartition", "/")
_FIRST = itemgetter(0)


def normalize_keys(keys: Sequence[str]) -> list[str]:
    """normalize_key of each key: the keys as they are when none needs a change (checked on
    the whole column at once: no outer blanks, NFC, no backslash, no leading './' or '/')."""
    keys = list(keys)
    joined = "\n".join(keys)  # "\n" composes with nothing: NFC of the whole is NFC of each
    if (
        "\\" in joined
        or joined.startswith(("/", "./"))
        or "\n/" in joined
        or "\n./" in joined
        or not unicodedata.is_normalized("NFC", joined)
        or list(map(str.strip, keys)) != keys
    ):
        return list(map(normalize_key, keys))
    return keys


def image_keys(relpaths: Sequence[str], mode: str = "stem") -> list[str]:
    """table.image_key of each relpath, computed for the column at once."""
    if mode == "relpath":
        return normalize_keys(relpaths)
    if mode not in ("name", "stem"):
        raise ValueError("--image_key must be one of stem, name, relpath")
    names = list(map(itemgetter(2), map(_LAST_SLASH, relpaths)))
    if mode == "stem":  # posixpath.splitext: a name's leading dots never start its extension
        heads = map(_FIRST, map(_LAST_DOT, names))
        names = [h if h.lstrip(".") else n for h, n in zip(heads, names)]
    return normalize_keys(names)


def plain_rows(builder: _RowBuilder, text: str, line: int) -> tuple[list, int]:
    """The rows of a plain block (table._plain_text) whose first line is `line`, as
    [LabelRows] when every column converts cleanly, else as LabelRows one by one
    (builder.rows_of_text); and the block's line count.

    Raises:
      TableError: a field longer than the csv module's limit (from rows_of_text).
    """
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()
    n, width = len(lines), builder._width
    delimiter = _delimiter(builder._spec)
    if (
        not n
        or width < 2
        or set(map(str.count, lines, repeat(delimiter, n))) != {width - 1}
        or max(map(len, lines)) > _FIELD_LIMIT
    ):
        return builder.rows_of_text(text, line)
    cells = delimiter.join(lines).split(delimiter)
    keys = normalize_keys(cells[builder._key :: width])
    labels = _cached(cells[builder._label :: width], builder._labels, _label_cell, builder)
    splits: Sequence[str | None] = (None,) * n
    if builder._split is not None:
        splits = _cached(cells[builder._split :: width], builder._splits, _split_cell, builder)
    extras = _extras(cells, builder, n)
    if "" in keys or labels is None or splits is None or extras is None:
        return builder.rows_of_text(text, line)
    source = builder._source
    batch = LabelRows(
        tuple(keys),
        tuple(labels),
        tuple(splits),
        extras,
        (source,) * n,
        tuple(range(line, line + n)),
        (None,) * n,
    )
    return [batch], n


def _label_cell(cell: str, builder: _RowBuilder) -> tuple:
    try:
        return split_labels(cell, builder._spec.separator), None
    except ValueError as e:
        return (), str(e)


def _split_cell(cell: str, builder: _RowBuilder) -> tuple:
    return _check_split(cell, builder._spec.split_column)


def _cached(cells: list[str], cache: dict, parse, builder: _RowBuilder) -> list | None:
    """The parsed value of each cell (parse(cell) -> (value, error), kept in `cache` per
    distinct cell, as _RowBuilder.row keeps it), or None if a cell has an error."""
    distinct = set(cells)
    if len(cache) + len(distinct) > _CACHE_SIZE:
        cache.clear()
    for cell in distinct.difference(cache):
        cache[cell] = parse(cell, builder)
    if any(cache[cell][1] is not None for cell in distinct):
        return None
    return list(map(_FIRST, map(cache.__getitem__, cells)))


def _extras(cells: list[str], builder: _RowBuilder, n: int) -> tuple | None:
    """The extras column ((name, value), ...) a row, converted as convert_extra does; None
    if a value does not convert (the row parser then names it)."""
    if not builder._extras:
        return ((),) * n
    width, columns = builder._width, []
    for name, kind, i in builder._extras:
        values: Iterable = cells[i::width]
        try:
            if kind == "int":
                values = list(map(int, map(str.strip, values)))
            elif kind == "float":
                values = list(map(float, values))
        except ValueError:
            return None
        columns.append(zip(repeat(name), values))
    return tuple(zip(*columns))


def iter_row_batches(
    chunks: Iterable[bytes], spec: TableSpec, source: str = "", size: int = BATCH_SIZE
) -> Iterator[LabelRows]:
    """The rows of a table streamed as bytes (as iter_table takes it), in LabelRows of up
    to `size` rows, in file order.

    Raises:
      TableError: as iter_table.
    """
    pending: list[list] = [[] for _ in range(7)]
    for item in iter_table(chunks, spec, source, plain=plain_rows):
        if type(item) is LabelRows:
            for column, values in zip(pending, item.columns()):
                column.extend(values)
        else:
            for column, value in zip(pending, item):
                column.append(value)
        if len(pending[0]) >= size:
            done = len(pending[0]) // size * size
            for start in range(0, done, size):
                yield LabelRows(*(tuple(column[start : start + size]) for column in pending))
            for column in pending:
                del column[:done]
    if pending[0]:
        yield LabelRows(*map(tuple, pending))


def rows_of(batches: Iterable[LabelRows]) -> list[LabelRow]:
    """Every row of the batches, one LabelRow each (for tests and small tables)."""
    return [row for batch in batches for row in batch.rows]
