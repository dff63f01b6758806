"""Parsing a labels table (CSV, TSV, JSON Lines; plain or compressed) into LabelRows (pure).

In: a table file's bytes, a block at a time. Out: LabelRow per row (key, labels, split,
extra columns) or the reason a row is invalid. Plain blocks are split directly; blocks with
quotes go through the csv module until a record ends at a block end.

About 600 lines: the block parser, its csv-module fallback and the checks of each cell
(labels, splits, extra columns) must agree line for line, and are tested together
(tests/labels/test_label_table.py compares the block parser with the csv module).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import posixpath
import stat
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping

from apache_beam.io.filesystems import FileSystems

from transforms.labels.folders import class_name_problem
from transforms.labels.rows import (
    _COMPRESSED_SUFFIXES,
    _FORMAT_OF_SUFFIX,
    _SPLIT_NAME,
    EXTRA_TYPES,
    FORMATS,
    IMAGE_KEYS,
    LabelRow,
    TableError,
    TableSpec,
    _new_row,
)


def detect_format(path: str, fmt: str = "auto") -> str:
    """The table format: `fmt` if given, else from the file suffix (.csv, .tsv, .jsonl, +.gz).

    Raises:
      ValueError: unknown format or a suffix that does not say.
    """
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ValueError(f"--labels_format must be one of auto, {', '.join(FORMATS)}")
        return fmt
    name = path.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    found = _FORMAT_OF_SUFFIX.get(posixpath.splitext(name)[1])
    if found is None:
        raise ValueError(
            f"--labels {path}: cannot tell the format from the name; pass --labels_format csv|tsv|jsonl"
        )
    return found


def parse_extra_columns(spec: str) -> tuple[tuple[str, str], ...]:
    """Parses 'weight:float,source:str' into (('weight', 'float'), ('source', 'str')).

    Raises:
      ValueError: malformed entry, unknown type or a column named twice.
    """
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


def normalize_key(text: str) -> str:
    """A key as both sides of the join see it: NFC Unicode, '/'-separated, no outer blanks.

    NFC matters for Korean (and any composed script): macOS writes file names decomposed
    (NFD) while tables are usually composed.
    """
    key = unicodedata.normalize("NFC", text.strip()).replace("\\", "/")
    while key.startswith("./"):
        key = key[2:]
    return key.lstrip("/")


def image_key(relpath: str, mode: str = "stem") -> str:
    """The join key of an image: its file stem, file name or path relative to the input."""
    if mode == "relpath":
        return normalize_key(relpath)
    name = relpath.rsplit("/", 1)[-1]
    if mode == "name":
        return normalize_key(name)
    if mode == "stem":
        return normalize_key(posixpath.splitext(name)[0])
    raise ValueError(f"--image_key must be one of {', '.join(IMAGE_KEYS)}")


def split_labels(value: object, separator: str = "|") -> tuple[str, ...]:
    """The labels of one cell: a JSON list, an int, or text split at `separator`.

    Blank parts are dropped and repeats removed (first occurrence kept).

    Raises:
      ValueError: a value that is neither text, an integer nor a list of those, or a label
        that cannot be a class name (a line break or other control character inside it).
    """
    if value is None:
        return ()
    if isinstance(value, list):
        parts: list[str] = []
        for v in value:
            parts.extend(split_labels(v, ""))
    elif isinstance(value, bool) or isinstance(value, float):
        raise ValueError(f"label {value!r} is neither text nor an integer")
    elif isinstance(value, int):
        parts = [str(value)]
    elif isinstance(value, str):
        parts = value.split(separator) if separator else [value]
    else:
        raise ValueError(f"label {value!r} is neither text nor an integer")
    cleaned = (unicodedata.normalize("NFC", p.strip()) for p in parts)
    labels = tuple(dict.fromkeys(p for p in cleaned if p))
    for name in labels:
        problem = class_name_problem(name)
        if problem:
            raise ValueError(f"label {name!r} {problem}")
    return labels


def convert_extra(name: str, kind: str, value: object) -> object:
    """One extra column's value as an int, float or str feature.

    Raises:
      ValueError: empty, or not of the declared type.
    """
    if value is None or (isinstance(value, str) and not value.strip() and kind != "str"):
        raise ValueError(f"column {name!r} is empty")
    if kind == "str":
        return "" if value is None else str(value)
    if isinstance(value, bool):
        raise ValueError(f"column {name!r}: {value!r} is not {'an int' if kind == 'int' else 'a float'}")
    try:
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value.strip()) if isinstance(value, str) else int(value)
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"column {name!r}: {value!r} is not {'an int' if kind == 'int' else 'a float'}"
        ) from None


def parse_row(fields: Mapping[str, object], spec: TableSpec, source: str = "", line: int = 0) -> LabelRow:
    """A LabelRow from one record of the table (a CSV row as a dict, or a JSON object).

    Never raises for bad values: the row carries an `error` naming the problem instead.
    """
    raw_key = fields.get(spec.key_column)
    key = normalize_key(str(raw_key)) if raw_key is not None and not isinstance(raw_key, (dict, list)) else ""

    def bad(reason: str) -> LabelRow:
        return LabelRow(key=key, source=source, line=line, error=reason)

    if not key:
        return bad(f"no value in key column {spec.key_column!r}")
    missing = [c for c in spec.required_columns() if c not in fields or fields[c] is None]
    missing = [c for c in missing if c != spec.label_column]  # a missing label is "unlabeled"
    if missing:
        return bad(f"no value in column {missing[0]!r}")
    try:
        labels = split_labels(fields.get(spec.label_column), spec.separator)
        extras = tuple((name, convert_extra(name, kind, fields[name])) for name, kind in spec.extra_columns)
    except ValueError as e:
        return bad(str(e))
    split = None
    if spec.split_column:
        split, problem = _check_split(fields[spec.split_column], spec.split_column)
        if problem:
            return bad(problem)
    return LabelRow(key=key, labels=labels, split=split, extras=extras, source=source, line=line)


# Bytes read from a table file at a time, and about the size of a block parsed in one go.
_BLOCK_BYTES = 1 << 20


# A line is at most this long (a file without line breaks is not a table): bounds a block.
_MAX_LINE_BYTES = 64 << 20


# The csv module's field size limit (131,072 characters): longer fields are an error.
_FIELD_LIMIT = csv.field_size_limit()


# Label cells parsed once per distinct value (tables repeat a few labels many times).
_CACHE_SIZE = 100_000


def _line_blocks(chunks: Iterable[bytes], source: str) -> Iterator[bytes]:
    """Byte chunks regrouped into blocks of whole lines: the first line alone (the header),
    then blocks of about _BLOCK_BYTES. Only the last block may lack its final newline.

    Raises:
      TableError: a line longer than _MAX_LINE_BYTES (not a table, e.g. a binary file).
    """
    buf: list[bytes] = []
    size, header = 0, True
    for chunk in chunks:
        if not chunk:
            continue
        buf.append(chunk)
        size += len(chunk)
        if not header and size < _BLOCK_BYTES:
            continue
        data = b"".join(buf)
        cut = data.find(b"\n") if header else data.rfind(b"\n")
        if cut < 0:
            if size > _MAX_LINE_BYTES:
                raise TableError(f"labels table {source}: a line longer than {_MAX_LINE_BYTES >> 20} MiB")
            buf = [data]
            continue
        yield data[: cut + 1]
        rest = data[cut + 1 :]
        buf, size, header = ([rest] if rest else []), len(rest), False
    if size:
        yield b"".join(buf)


def _split_lines(block: bytes) -> list[bytes]:
    """Lines of a block, each with its newline (as readline gives them: split at b'\\n' only)."""
    parts = block.split(b"\n")
    last = parts.pop()
    lines = [p + b"\n" for p in parts]
    if last:
        lines.append(last)
    return lines


def _plain_text(block: bytes) -> str | None:
    """The block as text if every line is one record split at the delimiter alone (no quote,
    NUL or lone carriage return; valid UTF-8), with CRLF line ends made LF; else None."""
    if b'"' in block or b"\x00" in block:
        return None
    if b"\r" in block and block.count(b"\r") != block.count(b"\r\n"):
        return None
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.replace("\r\n", "\n") if "\r" in text else text


class _LineFeed:
    """Decoded lines for the csv module: a block's, then the next blocks' as it asks for more.

    Counts lines (absolute numbers), notes undecodable ones, and tells whether every line of
    the blocks taken so far was handed out (a record that ends there ends at a block end).
    """

    def __init__(self, block: bytes, blocks: Iterator[bytes], line: int, keep_record: bool = True):
        self._blocks = blocks
        self._keep_record = keep_record
        self._lines = _split_lines(block)
        self._next = 0
        self.number = line  # lines handed out so far (absolute)
        self.bad_lines: set[int] = set()
        self.record: list[str] = []  # lines handed out since the caller cleared it (if kept)
        self.ended = False  # the end of the data was reached

    def __iter__(self) -> _LineFeed:
        return self

    def __next__(self) -> str:
        while self._next >= len(self._lines):
            try:
                self._lines, self._next = _split_lines(next(self._blocks)), 0
            except StopIteration:
                self.ended = True
                raise
        raw = self._lines[self._next]
        self._next += 1
        self.number += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.bad_lines.add(self.number)
            text = raw.decode("utf-8", "replace")
        if self.number == 1:
            text = text.removeprefix("\ufeff")
        if self._keep_record:
            self.record.append(text)
        return text

    def at_block_end(self) -> bool:
        return self._next >= len(self._lines)


class _RowBuilder:
    """LabelRows from the cells of CSV/TSV records, as parse_row makes them from a dict of the
    record (the last of same-named columns wins), with label and split cells parsed once per
    distinct value."""

    def __init__(self, header: list[str], spec: TableSpec, source: str):
        self._spec, self._source = spec, source
        self._width = len(header)
        index = {name: i for i, name in enumerate(header)}
        self._key_first = header.index(spec.key_column)
        self._key, self._label = index[spec.key_column], index[spec.label_column]
        self._split = index[spec.split_column] if spec.split_column else None
        self._extras = tuple((name, kind, index[name]) for name, kind in spec.extra_columns)
        self._labels: dict[str, tuple[tuple[str, ...], str | None]] = {}  # cell -> (labels, error)
        self._splits: dict[str, tuple[str | None, str | None]] = {}

    def row(self, cells: list[str], line: int) -> LabelRow | None:
        """The row of one record's cells, or None for a blank record (skipped)."""
        source = self._source
        if len(cells) != self._width:
            if not any(c.strip() for c in cells):
                return None
            key = cells[self._key_first] if len(cells) > self._key_first else ""
            error = f"{len(cells)} fields where the header has {self._width}"
            return LabelRow(normalize_key(key), source=source, line=line, error=error)
        key = normalize_key(cells[self._key])
        if not key:
            if not any(c.strip() for c in cells):
                return None
            return LabelRow(
                key, source=source, line=line, error=f"no value in key column {self._spec.key_column!r}"
            )
        cell = cells[self._label]
        found = self._labels.get(cell)
        if found is None:
            if len(self._labels) >= _CACHE_SIZE:
                self._labels.clear()
            try:
                found = (split_labels(cell, self._spec.separator), None)
            except ValueError as e:
                found = ((), str(e))
            self._labels[cell] = found
        labels, error = found
        if error:
            return LabelRow(key, source=source, line=line, error=error)
        extras: tuple = ()
        if self._extras:
            try:
                extras = tuple((name, convert_extra(name, kind, cells[i])) for name, kind, i in self._extras)
            except ValueError as e:
                return LabelRow(key, source=source, line=line, error=str(e))
        split = None
        if self._split is not None:
            cell = cells[self._split]
            found = self._splits.get(cell)
            if found is None:
                if len(self._splits) >= _CACHE_SIZE:
                    self._splits.clear()
                found = self._splits[cell] = _check_split(cell, self._spec.split_column)
            split, error = found
            if error:
                return LabelRow(key, source=source, line=line, error=error)
        return _new_row((key, labels, split, extras, source, line, None))

    def rows_of_text(self, text: str, line: int) -> tuple[list[LabelRow], int]:
        """Rows of a plain block (_plain_text) whose first line is `line`; and its line count.

        Raises:
          TableError: a field longer than the csv module's limit (its message and line).
        """
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()
        delimiter, build, out = _delimiter(self._spec), self.row, []
        for number, text_line in enumerate(lines, line):
            cells = text_line.split(delimiter)
            if len(text_line) > _FIELD_LIMIT and max(map(len, cells)) > _FIELD_LIMIT:
                raise TableError(
                    f"labels table {self._source} line {number}: field larger than field limit ({_FIELD_LIMIT})"
                )
            row = build(cells, number)
            if row is not None:
                out.append(row)
        return out, len(lines)


def _ends_in_quotes(lines: list[str], delimiter: str) -> bool:
    """Whether a record that the end of the data ended was still inside a quoted field (the
    csv module then returns what it has instead of an error, unless strict)."""
    try:
        for _ in csv.reader(lines, delimiter=delimiter, strict=True):
            pass
    except csv.Error as e:
        return "unexpected end of data" in str(e)
    return False


def _check_split(cell: str, column: str) -> tuple[str | None, str | None]:
    """(split, None) for a valid split name in `column`, else (None, the reason)."""
    split = unicodedata.normalize("NFC", str(cell).strip())
    if not _SPLIT_NAME.fullmatch(split):
        return None, f"split {split!r} in column {column!r} is not a valid split name"
    return split, None


def _delimiter(spec: TableSpec) -> str:
    return "\t" if spec.format == "tsv" else ","


def check_header(header: list[str], spec: TableSpec, source: str, what: str = "column") -> None:
    """Raises TableError naming the first required column the header lacks, and the fix."""
    present = [h.strip() for h in header]
    for column in spec.required_columns():
        if column not in present:
            raise TableError(
                f"labels table {source} has no {what} {column!r} ({what}s: {', '.join(present[:12])}); "
                + _column_fix(column, present, spec)
            )


def _column_fix(column: str, present: list[str], spec: TableSpec) -> str:
    """Which flag names the missing column, with a column of the table as its likely value."""
    flag = {spec.key_column: "--key_column", spec.label_column: "--label_column"}.get(column)
    if flag is None:
        flag = "--split_column" if column == spec.split_column else "--extra_columns"
        return f"fix {flag}"
    taken = set(spec.required_columns())
    free = [c for c in present if c and c not in taken]
    return f"name the {flag[2:].replace('_', ' ')} with {flag} " + (free[0] if free else "NAME")


def iter_table(
    chunks: Iterable[bytes],
    spec: TableSpec,
    source: str = "",
    plain: Callable[[_RowBuilder, str, int], tuple[list, int]] | None = None,
) -> Iterator[LabelRow]:
    """Parses a table streamed as bytes (any pieces: lines, or blocks read from a file) into
    LabelRow tuples, in file order.

    `plain(builder, text, first line)` parses the plain blocks instead of
    `_RowBuilder.rows_of_text` (columns.plain_rows yields a whole block as one LabelRows).

    CSV and TSV: a header row, RFC 4180 quoting (quoted fields may hold the delimiter,
    quotes and newlines), UTF-8 with or without BOM. JSON Lines: one object per line.
    Lines are numbered from 1, split at '\\n' (as readline does).

    CSV and TSV are parsed a block of lines (~1 MB) at a time: a block without quotes,
    NUL bytes, lone carriage returns or undecodable bytes is split at line ends and
    delimiters directly (the common case, several times faster); any other block goes
    through the csv module, line by line, until a record ends where a block ends. Both give
    the same rows: the csv module splits such a block the same way.

    Raises:
      TableError: the header lacks a required column, or the text is not CSV (the csv
        module's errors: a field over its limit, a line break in an unquoted field; and a
        quoted field never closed, which the csv module would end at the end of the data).
    """
    if spec.format == "jsonl":
        feed = _LineFeed(b"", _line_blocks(chunks, source), 0, keep_record=False)
        yield from _iter_jsonl(feed, spec, source, feed.bad_lines)
        return
    blocks = _line_blocks(chunks, source)
    builder: _RowBuilder | None = None
    line = 0  # lines parsed so far
    for block in blocks:
        text = _plain_text(block) if builder is not None else None
        if text is not None:
            rows, count = (plain or _RowBuilder.rows_of_text)(builder, text, line + 1)
            yield from rows
            line += count
            continue
        feed = _LineFeed(block, blocks, line)
        reader = csv.reader(feed, delimiter=_delimiter(spec))
        try:
            if builder is None:
                header = next(reader, None)
                if header is None:
                    raise TableError(f"labels table {source} is empty")
                check_header(header, spec, source)
                builder = _RowBuilder([h.strip() for h in header], spec, source)
            while not feed.at_block_end():
                first = feed.number + 1
                feed.record.clear()
                cells = next(reader, None)
                if cells is None:
                    break
                if feed.ended and _ends_in_quotes(feed.record, _delimiter(spec)):
                    raise TableError(
                        f"labels table {source} line {first}: a quoted field is never closed "
                        '(a missing ", it would take in every line to the end)'
                    )
                last = feed.number
                if not any(c.strip() for c in cells):
                    continue
                if any(n in feed.bad_lines for n in range(first, last + 1)):
                    yield LabelRow(
                        key="", source=source, line=first, error=f"line {first} is not valid UTF-8"
                    )
                    continue
                row = builder.row(cells, first)
                if row is not None:
                    yield row
        except csv.Error as e:
            raise TableError(f"labels table {source} line {line + reader.line_num}: {e}") from None
        line = feed.number
    if builder is None:
        raise TableError(f"labels table {source} is empty")


def _iter_jsonl(
    lines: Iterable[str], spec: TableSpec, source: str, bad_lines: set[int]
) -> Iterator[LabelRow]:
    for line, text in enumerate(lines, 1):
        if not text.strip():
            continue
        if line in bad_lines:
            yield LabelRow(key="", source=source, line=line, error=f"line {line} is not valid UTF-8")
            continue
        try:
            obj = json.loads(text)
        except ValueError as e:
            yield LabelRow(key="", source=source, line=line, error=f"not JSON: {e}")
            continue
        if not isinstance(obj, dict):
            yield LabelRow(key="", source=source, line=line, error="not a JSON object")
            continue
        yield parse_row(obj, spec, source, line)


def read_header(path: str, spec: TableSpec) -> list[str]:
    """The column names of one table file: the CSV header, or the keys of the first JSON line.

    Reads only the beginning of the file. Raises TableError (or OSError if unreadable).
    """
    with FileSystems.open(path) as f:
        first = b""
        while not first.strip():
            first = f.readline()
            if not first:
                raise TableError(f"labels table {path} is empty")
            if spec.format != "jsonl":
                break
        if spec.format != "jsonl":
            # A quoted header cell may span lines; read on until the record is complete.
            raw = [first]
            while raw[-1] and raw[-1].count(b'"') % 2 and len(raw) < 100:
                raw.append(f.readline())
            first = b"".join(raw)
    try:
        text = first.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise TableError(f"labels table {path} is not UTF-8 text") from None
    if spec.format == "jsonl":
        try:
            obj = json.loads(text)
        except ValueError:
            raise TableError(f"labels table {path}: the first line is not a JSON object") from None
        if not isinstance(obj, dict):
            raise TableError(f"labels table {path}: the first line is not a JSON object")
        return list(obj)
    try:
        return next(csv.reader(text.splitlines(keepends=True), delimiter=_delimiter(spec)))
    except (csv.Error, StopIteration):
        raise TableError(f"labels table {path}: cannot read the header") from None


def check_regular_file(path: str) -> None:
    """A local table must be a regular file: a pipe (`<(zcat t.csv.gz)`, a FIFO) or a device
    would hang the open, or be read up by the header check before the pipeline reads it.

    Raises:
      TableError: a local path that is not a regular file.
    """
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


def check_table(spec: TableSpec) -> list[str]:
    """Cheap checks on the submitting machine: the table exists and has the columns.

    Reads only the first line of each matched file (a glob may match several). Returns the
    matched paths.

    Raises:
      TableError: no such file, not a regular file, or a required column is missing.
    """
    try:
        found = FileSystems.match([spec.path])[0].metadata_list
    except Exception:  # noqa: BLE001 - Beam raises BeamIOError/OSError/ValueError per filesystem
        found = []
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
