"""Parsing a labels table (CSV, TSV, JSON Lines; plain or compressed) into LabelRows (pure).

In: a table file (read as a stream). Out: LabelRows, each row's reason if it is invalid.
CSV and TSV by pyarrow.csv, a block of ~4 MB at a time, each column checked for the block at
once; JSON Lines by the json module, a line at a time.

Over 500 lines: the rules of each cell and of the records pyarrow hands over or rejects
(their lines, bad UTF-8, blank records, a quote never closed) are one table's rules, tested
together in tests/labels/test_label_table.py.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import itertools
import json
import os
import posixpath
import re
import stat
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import itemgetter, methodcaller
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.gcs import literal_or_glob
from transforms.labels.folders import class_name_problem
from transforms.labels.rows import (
    _COMPRESSED_SUFFIXES,
    _FORMAT_OF_SUFFIX,
    _SPLIT_NAME,
    EXTRA_TYPES,
    FORMATS,
    IMAGE_KEYS,
    LabelRow,
    LabelRows,
    TableError,
    TableSpec,
)
from transforms.records import BATCH_SIZE


def detect_format(path: str, fmt: str = "auto") -> str:
    """The table format: `fmt` if given, else from the suffix (.csv, .tsv, .jsonl, +.gz); ValueError if unknown."""
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


def normalize_key(text: str) -> str:
    """A key as both sides of the join see it: NFC Unicode (macOS writes file names
    decomposed, tables are usually composed), '/'-separated, no outer blanks."""
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


_LAST_DOT = methodcaller("rpartition", ".")
_LAST_SLASH = methodcaller("rpartition", "/")
_FIRST = itemgetter(0)


def normalize_keys(keys: Sequence[str]) -> list[str]:
    """normalize_key of each key (the keys as they are when the whole column needs no change)."""
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


def split_labels(value: object, separator: str = "|") -> tuple[str, ...]:
    """The labels of one cell: a JSON list, an int, or text split at `separator`; blank
    parts dropped, repeats removed. ValueError: neither text, an integer nor a list of
    those, or a label that cannot be a class name (folders.class_name_problem)."""
    if value is None:
        return ()
    if isinstance(value, list):
        parts: list[str] = []
        for v in value:
            parts.extend(split_labels(v, ""))
    elif isinstance(value, int) and not isinstance(value, bool):
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
    """One extra column's value as an int, float or str feature (ValueError: empty, or not of the type)."""
    if value is None or (isinstance(value, str) and not value.strip() and kind != "str"):
        raise ValueError(f"column {name!r} is empty")
    if kind == "str":
        return "" if value is None else str(value)
    try:
        if isinstance(value, bool) or (kind == "int" and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        if kind == "int":
            return int(value.strip()) if isinstance(value, str) else int(value)
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"column {name!r}: {value!r} is not {'an int' if kind == 'int' else 'a float'}"
        ) from None


def parse_row(fields: Mapping[str, object], spec: TableSpec, source: str = "", line: int = 0) -> LabelRow:
    """A LabelRow from one JSON object of the table; a bad value makes the row's `error`."""
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


# Bytes pyarrow parses at a time: a record (with its quoted line breaks) must fit in one.
_BLOCK_BYTES = 4 << 20
# The csv module's field size limit (131,072 characters), kept: a longer field is an error.
_FIELD_LIMIT = 131_072
# Label and split cells parsed once per distinct value (tables repeat a few labels many times).
_CACHE_SIZE = 100_000
# Given to pyarrow after the table's bytes: a record of its own unless a quote is never closed.
_END = "\x00end of the table\x00"
# What pyarrow is given for bytes that are not UTF-8: a noncharacter (never in interchanged text).
_NOT_UTF8 = "\ufdd0"
_UNDECODED = re.compile("[\udc80-\udcff]+")
_LONE_CR = re.compile("\r(?!\n)")


class _Text:
    """A table file's bytes as pyarrow reads them: UTF-8 (undecodable runs as _NOT_UTF8),
    then _END. Counts the lone carriage returns (pyarrow ends a line at one, the csv module
    refuses one outside quotes) and notes the first one's line."""

    closed = False

    def __init__(self, f: BinaryIO, lines: int):
        self._f, self._lines = f, lines  # lines read so far
        self._decode = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode
        self._held = ""  # a "\r" that ended the last chunk: the next may start with "\n"
        self._done, self._out = False, b""
        self.not_utf8 = False
        self.lone_cr = 0
        self.first_cr_line = 0

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (pyarrow asks for a block at a time)."""
        size = size if size and size > 0 else _BLOCK_BYTES
        while len(self._out) < size and not self._done:
            self._out += self._next(self._f.read(size))
        out, self._out = self._out[:size], self._out[size:]
        return out

    def _next(self, data: bytes) -> bytes:
        text = self._held + self._decode(data, final=not data)
        self._held = ""
        if not data:
            self._done = True
            text += f"\n{_END}\n"
        elif text.endswith("\r"):
            text, self._held = text[:-1], "\r"
        if "\r" in text and (found := _LONE_CR.search(text)):
            if not self.lone_cr:
                self.first_cr_line = self._lines + text.count("\n", 0, found.start()) + 1
            self.lone_cr += len(_LONE_CR.findall(text))
        self._lines += text.count("\n")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            self.not_utf8 = True
            return _UNDECODED.sub(_NOT_UTF8, text).encode("utf-8")


def _count(column: pa.Array, text: str) -> np.ndarray:
    """How often `text` occurs in each value of the column."""
    return pc.count_substring(column, text).to_numpy(zero_copy_only=False)


def _first_errors(first: list | None, then: list | None) -> list | None:
    """Per row, the first of two columns of errors (None: no row has one)."""
    if first is None or then is None:
        return then if first is None else first
    return [a or b for a, b in zip(first, then)]


class _Columns:
    """LabelRows' columns from the cells of CSV/TSV records, as parse_row makes them from a
    dict of the record: keys normalized for the column at once, label and split cells
    parsed once per distinct value."""

    def __init__(self, header: list[str], spec: TableSpec, source: str):
        self._spec, self._source, self._width = spec, source, len(header)
        at = {name: i for i, name in enumerate(header)}
        self._key_first = header.index(spec.key_column)
        self._key, self._label = at[spec.key_column], at[spec.label_column]
        self._split = at[spec.split_column] if spec.split_column else None
        self._extras = tuple((name, kind, at[name]) for name, kind in spec.extra_columns)
        self._labels: dict = {}  # cell -> (labels, error)
        self._splits: dict = {}  # cell -> (split, error)

    def rows(self, columns: list[pa.Array], lines: list[int], not_utf8: bool) -> list[tuple]:
        """The seven columns of a batch's records (first lines `lines`), and each record's
        position (blank records left out). TableError: a field longer than _FIELD_LIMIT."""
        n, source = len(lines), self._source
        for column in columns:
            lengths = pc.utf8_length(column)
            if n and pc.max(lengths).as_py() > _FIELD_LIMIT:
                at = np.flatnonzero(lengths.to_numpy(zero_copy_only=False) > _FIELD_LIMIT)[0]
                raise TableError(
                    f"labels table {source} line {lines[at]}: field larger than field limit ({_FIELD_LIMIT})"
                )
        keys = normalize_keys(columns[self._key].to_pylist())
        labels, errors = self._parsed(columns[self._label], self._labels, self._label_cell)
        extras: list = [()] * n
        if self._extras:
            extras, extra_errors = self._converted([columns[i].to_pylist() for _, _, i in self._extras])
            errors = _first_errors(errors, extra_errors)
        splits: list = [None] * n
        if self._split is not None:
            splits, split_errors = self._parsed(columns[self._split], self._splits, self._split_cell)
            errors = _first_errors(errors, split_errors)
        bad_text = np.zeros(n, bool)
        if not_utf8:
            for column in columns:
                bad_text |= _count(column, _NOT_UTF8) > 0
        if errors is None and "" not in keys and not bad_text.any():
            return [(keys, labels, splits, extras, [source] * n, lines, [None] * n), range(n)]
        rows, kept = [], []
        for i, key in enumerate(keys):
            line, error = lines[i], errors[i] if errors else None
            if bad_text[i]:
                key, error = "", f"line {line} is not valid UTF-8"
            elif not key:
                if not any(column[i].as_py().strip() for column in columns):
                    continue  # a blank record
                error = f"no value in key column {self._spec.key_column!r}"
            kept.append(i)
            if error:
                rows.append((key, (), None, (), source, line, error))
            else:
                rows.append((key, labels[i], splits[i], extras[i], source, line, None))
        return [list(zip(*rows)) if rows else [[] for _ in range(7)], kept]

    def invalid(self, text: str, line: int) -> tuple | None:
        """The row of a record whose number of fields is not the header's (None if blank)."""
        if _NOT_UTF8 in text:
            return ("", (), None, (), self._source, line, f"line {line} is not valid UTF-8")
        cells = next(csv.reader([text], delimiter=_delimiter(self._spec)), [])
        if not any(c.strip() for c in cells):
            return None
        key = normalize_key(cells[self._key_first] if len(cells) > self._key_first else "")
        error = f"{len(cells)} fields where the header has {self._width}"
        return (key, (), None, (), self._source, line, error)

    def _label_cell(self, cell: str) -> tuple:
        try:
            return split_labels(cell, self._spec.separator), None
        except ValueError as e:
            return (), str(e)

    def _split_cell(self, cell: str) -> tuple:
        return _check_split(cell, self._spec.split_column)

    @staticmethod
    def _parsed(column: pa.Array, cache: dict, parse: Callable) -> tuple[list, list | None]:
        """parse(cell) -> (value, error), once per distinct cell: the values, and the errors (None if none)."""
        coded = column.dictionary_encode()
        distinct = coded.dictionary.to_pylist()
        if len(cache) + len(distinct) > _CACHE_SIZE:
            cache.clear()
        found = [cache.get(cell) or cache.setdefault(cell, parse(cell)) for cell in distinct]
        index = coded.indices.to_numpy(zero_copy_only=False).tolist()
        values = list(map([f[0] for f in found].__getitem__, index))
        if not any(f[1] for f in found):
            return values, None
        return values, list(map([f[1] for f in found].__getitem__, index))

    def _converted(self, cells: list[list[str]]) -> tuple[list, list | None]:
        """The extras of each row (convert_extra of each of its extra cells), and the errors."""
        extras, errors, names = [], [], self._extras
        for values in zip(*cells):
            try:
                extras.append(
                    tuple((name, convert_extra(name, kind, v)) for (name, kind, _), v in zip(names, values))
                )
                errors.append(None)
            except ValueError as e:
                extras.append(())
                errors.append(str(e))
        return extras, errors if any(errors) else None


def _first_record(f: BinaryIO, spec: TableSpec, source: str) -> tuple[list[str], int]:
    """The header of a CSV/TSV file (by the csv module: a quoted cell may span lines) and
    the lines it takes; the file is left after it. TableError: empty, not UTF-8, not CSV."""
    raw = [f.readline()]
    if not raw[0]:
        raise TableError(f"labels table {source} is empty")
    while raw[-1] and b"".join(raw).count(b'"') % 2 and len(raw) < 100:
        raw.append(f.readline())
    try:
        text = b"".join(raw).decode("utf-8").removeprefix("\ufeff")
        return next(csv.reader(text.splitlines(keepends=True), delimiter=_delimiter(spec)), []), len(raw)
    except UnicodeDecodeError:
        raise TableError(f"labels table {source} is not UTF-8 text") from None
    except csv.Error:
        raise TableError(f"labels table {source}: cannot read the header") from None


def _csv_columns(f: BinaryIO, spec: TableSpec, source: str) -> Iterator[list]:
    """The records of a CSV/TSV file after its header, a pyarrow batch at a time, as seven
    columns, in file order: pyarrow parses serially and hands over well-formed records; one
    with a wrong number of fields goes to the handler and is put back in place by its number.
    A record's line is its number plus the line breaks inside the fields before it."""
    header, line = _first_record(f, spec, source)
    header = [h.strip() for h in header]
    check_header(header, spec, source)
    builder, text = _Columns(header, spec, source), _Text(f, line)
    rejected: dict[int, str] = {}  # record number -> its text

    def reject(row: pacsv.InvalidRow) -> str:
        rejected[row.number] = row.text
        return "skip"

    names = [str(i) for i in range(len(header))]
    record, last, ended, quoted_cr = 0, line, False, 0  # records placed; line of the last; _END read
    try:
        reader = pacsv.open_csv(
            text,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=_BLOCK_BYTES, column_names=names),
            parse_options=pacsv.ParseOptions(
                delimiter=_delimiter(spec),
                newlines_in_values=True,
                ignore_empty_lines=False,
                invalid_row_handler=reject,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=False,
            ),
        )
        for batch in itertools.chain(reader, [None]):
            columns = batch.columns if batch is not None else []
            n = batch.num_rows if batch is not None else 0
            if batch is not None and not n:
                continue
            numbers = np.arange(record + 1, record + 1 + n)
            placed = []  # the rejected records before this batch's last
            for number in sorted(rejected):
                if n and number > numbers[-1]:
                    break
                numbers[numbers >= number] += 1
                placed.append((number, rejected.pop(number)))
            breaks = np.zeros(n, np.int64)
            for column in columns:
                breaks += _count(column, "\n")
            if text.lone_cr:
                quoted_cr += sum(int(_count(c, "\r").sum() - _count(c, "\r\n").sum()) for c in columns)
                quoted_cr += sum(t.count("\r") - t.count("\r\n") for _, t in placed)
            every = np.concatenate([numbers, [number for number, _ in placed]]).astype(np.int64)
            if not len(every):
                break
            every_breaks = np.concatenate([breaks, [t.count("\n") for _, t in placed]]).astype(np.int64)
            order = np.argsort(every, kind="stable")
            before = np.cumsum(every_breaks[order]) - every_breaks[order]
            lines = np.empty(len(every), np.int64)
            lines[order] = line + every[order] - record + before
            line += int(every.max() - record + every_breaks.sum())
            record, last = int(every.max()), int(lines[order[-1]])
            out, kept = builder.rows(columns, lines[:n].tolist(), text.not_utf8) if n else ([[]] * 7, [])
            if placed:
                rows = list(zip(numbers[kept].tolist(), zip(*out))) if kept else []
                for (number, row_text), at in zip(placed, lines[n:].tolist()):
                    if row_text == _END:
                        ended = True
                    elif (row := builder.invalid(row_text, at)) is not None:
                        rows.append((number, row))
                rows.sort(key=itemgetter(0))
                out = list(zip(*(row for _, row in rows))) if rows else [[] for _ in range(7)]
            yield out
    except pa.ArrowInvalid as e:
        raise TableError(
            f"labels table {source} after line {line}: {e} (a quoted field never closed, or a record over "
            f"{_BLOCK_BYTES >> 20} MiB)"
        ) from None
    if text.lone_cr > quoted_cr:
        raise TableError(
            f"labels table {source} line {text.first_cr_line}: new-line character seen in unquoted field "
            "(a lone carriage return)"
        )
    if not ended:
        raise TableError(
            f"labels table {source} line {last}: a quoted field is never closed "
            '(a missing ", it would take in every line to the end)'
        )


def _jsonl_columns(f: BinaryIO, spec: TableSpec, source: str) -> Iterator[tuple]:
    """The rows of a JSON Lines file, as seven columns a BATCH_SIZE of lines, by the json
    module: pyarrow.json refuses a field whose type changes from row to row (a label as text,
    then a list) and stops at the first line that is not JSON instead of naming it."""
    rows: list[LabelRow] = []
    for line, raw in enumerate(iter(f.readline, b""), 1):  # (Beam's CompressedFile.readline takes no limit)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            rows.append(LabelRow(key="", source=source, line=line, error=f"line {line} is not valid UTF-8"))
            continue
        text = text.removeprefix("\ufeff") if line == 1 else text
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as e:
            rows.append(LabelRow(key="", source=source, line=line, error=f"not JSON: {e}"))
            continue
        if not isinstance(obj, dict):
            rows.append(LabelRow(key="", source=source, line=line, error="not a JSON object"))
        else:
            rows.append(parse_row(obj, spec, source, line))
        if len(rows) >= BATCH_SIZE:
            yield LabelRows.of(rows).columns()
            rows = []
    if rows:
        yield LabelRows.of(rows).columns()


def iter_row_batches(
    f: BinaryIO, spec: TableSpec, source: str = "", size: int = BATCH_SIZE
) -> Iterator[LabelRows]:
    """The rows of a table file (read as a stream) in LabelRows of up to `size`, in file order.

    CSV and TSV: a header row, RFC 4180 quoting (fields may hold the delimiter, quotes and
    line breaks), UTF-8 with or without BOM, CRLF or LF. JSON Lines: one object a line. A
    row's line is the line (from 1, split at '\\n') its record starts on.

    Raises TableError: the header lacks a required column, or the text is not CSV (a field
    over _FIELD_LIMIT characters, a lone carriage return outside quotes, a quoted field never
    closed, a record over _BLOCK_BYTES).
    """
    parts = _jsonl_columns(f, spec, source) if spec.format == "jsonl" else _csv_columns(f, spec, source)
    pending: list[list] = [[] for _ in range(7)]
    for columns in parts:
        for held, values in zip(pending, columns):
            held.extend(values)
        if len(pending[0]) >= size:
            done = len(pending[0]) // size * size
            for start in range(0, done, size):
                yield LabelRows(*(tuple(column[start : start + size]) for column in pending))
            for column in pending:
                del column[:done]
    if pending[0]:
        yield LabelRows(*map(tuple, pending))


def iter_table(f: BinaryIO, spec: TableSpec, source: str = "") -> Iterator[LabelRow]:
    """The rows of a table file one LabelRow each (for tests)."""
    for batch in iter_row_batches(f, spec, source):
        yield from batch.rows


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


def read_header(path: str, spec: TableSpec) -> list[str]:
    """The column names of a table file: the CSV header, or the keys of the first JSON line
    (TableError, or OSError if unreadable)."""
    with gcs.open_read(path) as f:
        if spec.format != "jsonl":
            return _first_record(f, spec, path)[0]
        first = b" "
        while not first.strip():
            first = f.readline()
            if not first:
                raise TableError(f"labels table {path} is empty")
    try:
        obj = json.loads(first.decode("utf-8").removeprefix("\ufeff"))
    except ValueError:  # UnicodeDecodeError too
        raise TableError(f"labels table {path}: the first line is not a JSON object") from None
    if not isinstance(obj, dict):
        raise TableError(f"labels table {path}: the first line is not a JSON object")
    return list(obj)


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


def check_table(spec: TableSpec) -> list[str]:
    """The matched paths, after cheap checks on the submitting machine (the first line of
    each): TableError for no such file, not a regular file, or a missing column."""
    try:
        found = FileSystems.match([literal_or_glob(spec.path)])[0].metadata_list
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
