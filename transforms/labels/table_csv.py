"""CSV and TSV tables by pyarrow.csv (pure): a block of records at a time into batches of rows.

In: a table's text (text.Utf8Stream). Out: Arrow batches of rows.ROW_COLUMNS (table.row_batch).
pyarrow.csv parses with its own rules: RFC 4180 quoting (the delimiter, quotes and line breaks
inside quoted fields: newlines_in_values), LF, CRLF or CR line ends, a record of the wrong
width handed to invalid_row_handler (its row is named invalid). What pyarrow does not say is a
record's line: its record number (from the handler's numbers) plus the line breaks inside the
quoted fields before it (_Lines). Blank records are left out.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from transforms.labels.cells import FIELD_LIMIT, check_header, normalize_key, row_batch
from transforms.labels.rows import KEY, LINE, LabelRow, TableError, TableSpec, rows_batch
from transforms.labels.text import LINE_CAP, Utf8Stream

# pyarrow's block: the bytes parsed at a time, which a record must fit in.
BLOCK_BYTES = LINE_CAP


def _reader(data, spec: TableSpec, block: int, handler, names: list[str] | None) -> pacsv.CSVStreamingReader:
    return pacsv.open_csv(
        data,
        read_options=pacsv.ReadOptions(use_threads=False, block_size=block),
        parse_options=pacsv.ParseOptions(
            delimiter=spec.csv_delimiter(),
            newlines_in_values=True,
            ignore_empty_lines=False,  # a blank line is a record: it counts in the record numbers
            invalid_row_handler=handler,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names or (), pa.string()),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            check_utf8=False,  # checked by Utf8Stream, with the line named
        ),
    )


def read_header(stream: Utf8Stream, spec: TableSpec, source: str) -> tuple[list[str], int]:
    """The header's column names and the lines it takes, read ahead (peek) of `stream`."""
    head = stream.peek(BLOCK_BYTES)
    if not head:
        raise TableError(f"labels table {source} is empty")
    try:
        names = _reader(io.BytesIO(head), spec, len(head) + 1, lambda row: "skip", None).schema.names
    except pa.ArrowInvalid as e:
        raise TableError(f"labels table {source}: cannot read the header: {e}") from None
    return names, 1 + sum(name.count("\n") for name in names)


class _Lines:
    """The line of each record, from its record number (the header's is 1): a record's line
    is its number plus the line breaks inside quoted fields of the records before it."""

    def __init__(self, header_lines: int):
        self.next, self.breaks, self.last = 2, header_lines - 1, 1
        self.rejected: dict[int, str] = {}  # record number -> text, from invalid_row_handler

    def reject(self, row: pacsv.InvalidRow) -> str:
        self.rejected[row.number] = row.text
        return "skip"

    def place(self, breaks: np.ndarray, final: bool = False) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """The lines of the next len(breaks) well-formed records (`breaks` inside each), and
        (line, text) of the rejected records among them (all that are left if `final`)."""
        n = len(breaks)
        numbers = np.arange(self.next, self.next + n, dtype=np.int64)
        placed = []
        for number in sorted(self.rejected):
            if not final and (not n or number > numbers[-1]):
                break
            numbers[numbers >= number] += 1
            placed.append((number, self.rejected.pop(number)))
        every = np.concatenate([numbers, np.array([p for p, _ in placed], np.int64)])
        every_breaks = np.concatenate(
            [breaks, np.array([t.count("\n") + t.count("\r") - t.count("\r\n") for _, t in placed], np.int64)]
        )
        if not len(every):
            return numbers, []
        order = np.argsort(every, kind="stable")
        before = np.cumsum(every_breaks[order]) - every_breaks[order] + self.breaks
        lines = np.empty_like(every)
        lines[order] = every[order] + before
        self.breaks += int(every_breaks.sum())
        self.next, self.last = int(every.max()) + 1, int(lines[order[-1]])
        return lines[:n], list(zip(lines[n:].tolist(), (text for _, text in placed)))


def csv_batches(stream: Utf8Stream, spec: TableSpec, source: str) -> Iterator[pa.RecordBatch]:
    """The rows of a CSV or TSV table, a block at a time (see the module docstring)."""
    header, header_lines = read_header(stream, spec, source)
    check_header(header, spec, source)
    at = {}
    for i, name in enumerate(header):
        at.setdefault(name.strip(), i)
    lines = _Lines(header_lines)
    try:
        for batch in _reader(stream, spec, BLOCK_BYTES, lines.reject, header):
            if batch.num_rows:
                yield from _block(batch, lines, at, len(header), spec, source, stream)
        yield from _block(None, lines, at, len(header), spec, source, stream)
    except pa.ArrowInvalid as e:
        what = (
            f"a record over {BLOCK_BYTES >> 20} MiB, or a quoted field never closed"
            if "straddl" in str(e)
            else str(e)
        )
        raise TableError(f"labels table {source} after line {lines.last}: {what}") from None
    if stream.quotes % 2:
        raise TableError(
            f'labels table {source} line {lines.last}: a quoted field is never closed (a missing ", '
            "it takes in every line to the end), or a '\"' inside an unquoted field (quote the field "
            "and double the '\"')"
        )


def _block(
    batch, lines: _Lines, at: dict, width: int, spec: TableSpec, source: str, stream: Utf8Stream
) -> Iterator[pa.RecordBatch]:
    """The rows of one block's records, then those of the records pyarrow rejected among them."""
    columns = batch.columns if batch is not None else []
    n = batch.num_rows if batch is not None else 0
    breaks = np.zeros(n, np.int64)
    if n and stream.quotes:  # a line break can only be inside a quoted field
        for column in columns:
            breaks += pc.count_substring(column, "\n").to_numpy(zero_copy_only=False)
            if stream.returns:  # a lone CR ends a line too
                breaks += pc.count_substring(column, "\r").to_numpy(zero_copy_only=False)
                breaks -= pc.count_substring(column, "\r\n").to_numpy(zero_copy_only=False)
    found, rejected = lines.place(breaks, final=batch is None)
    line = pa.array(found, pa.int64())
    for column in columns:
        if (pc.max(pc.utf8_length(column)).as_py() or 0) > FIELD_LIMIT:
            first = line[pc.index(pc.greater(pc.utf8_length(column), FIELD_LIMIT), True).as_py()]
            raise TableError(
                f"labels table {source} line {first}: field larger than field limit ({FIELD_LIMIT})"
            )
    parts = []
    if n:
        needed = {name: columns[i] for name, i in at.items() if name in spec.required_columns()}
        rows = row_batch(needed, line, spec, source)
        empty = pc.indices_nonzero(pc.equal(rows.column(KEY), b"")).to_pylist()  # blank, or no key
        blank = [i for i in empty if not any(c[i].as_py().strip() for c in columns)]
        parts.append(rows.filter(pc.invert(pc.is_in(pa.array(range(n)), pa.array(blank, pa.int64())))))
    bad = [_rejected(text, number, at[spec.key_column], spec, source, width) for number, text in rejected]
    if any(bad):
        parts.append(rows_batch([row for row in bad if row], spec))
        parts = [pa.Table.from_batches(parts).sort_by(LINE).combine_chunks().to_batches()[0]]
    yield from (part for part in parts if part.num_rows)


def _rejected(text: str, line: int, key_at: int, spec: TableSpec, source: str, width: int) -> LabelRow | None:
    """The row of a record whose number of fields is not the header's (None if it is blank)."""
    cells = next(csv.reader([text], delimiter=spec.csv_delimiter()), [])
    if not any(c.strip() for c in cells):
        return None
    key = normalize_key(cells[key_at] if len(cells) > key_at else "")
    return LabelRow(key, source=source, line=line, error=f"{len(cells)} fields where the header has {width}")
