"""Coders of the labels-table batches that cross a shuffle: their columns coded flat, a
few values a batch, never one coder call (or Python object) per row.

In: LabelRows, JoinPart, OrphanLines, and JoinedLabels.listed's items. Out: bytes. A batch
is a handful of flat columns (code_column), coded once by the primitive coder (pickled if it
cannot: coders.tagged). Text columns are one UTF-8 blob joined by NUL (surrogates of
undecodable file names pass), paths their root when each is root + relpath, ints one int64
array, labels, splits, sources and errors coders.dictionary_code's, extras the tuple they are
(1, 1.0 and True are equal but not the same).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import numpy as np

from transforms.coders import (
    TupleCoder,
    decode_record_batch,
    dictionary_code,
    dictionary_decode,
    encode_record_batch,
    estimate_record_batch,
    tagged,
    untagged,
)
from transforms.failures import Failure
from transforms.labels.rows import JoinPart, KeyedFiles, LabelRows, OrphanLines
from transforms.records import RecordBatch, root_of, rooted_paths

TEXT, INTS, FEW, ANY = "text", "ints", "few", "any"  # how each column is coded
_FILE_KINDS = (TEXT, TEXT, TEXT, INTS)  # KeyedFiles: keys, paths, relpaths, sizes
_ROW_KINDS = (TEXT, FEW, FEW, ANY, FEW, INTS, FEW)  # LabelRows' seven columns
_SEP = "\x00"
_INT64 = np.dtype("<i8")


def code_column(column: Sequence, kind: str) -> tuple:
    """One column as a few flat values (see the module docstring); decode_column reverses it."""
    column = tuple(column)
    n = len(column)
    if kind == TEXT and n:
        try:
            text = _SEP.join(column)
        except TypeError:
            return ("t", column)
        if text.count(_SEP) == n - 1:
            return ("s", text.encode("utf-8", "surrogatepass"))
    elif kind == INTS:  # ints by construction (sizes, line numbers)
        try:
            return ("q", np.array(column, dtype=_INT64).tobytes())
        except (TypeError, OverflowError, ValueError):
            pass
    elif kind == FEW or (kind == ANY and n and column.count(()) == n):  # extras: 1 and 1.0 kept apart
        table, codes = dictionary_code(column)
        if codes is not None:
            return ("d", table, codes)
    return ("t", column)


def decode_column(coded: tuple, n: int) -> tuple:
    """The column that code_column coded, `n` values long."""
    how = coded[0]
    if how == "s":
        return tuple(coded[1].decode("utf-8", "surrogatepass").split(_SEP))
    if how == "q":
        return tuple(np.frombuffer(coded[1], dtype=_INT64).tolist())
    if how == "d":
        return tuple(dictionary_decode(coded[1], coded[2], n))
    return tuple(coded[1])


def _code(columns: tuple, kinds: tuple) -> tuple:
    return (len(columns[0]) if columns else 0, *map(code_column, columns, kinds))


def _decode(t: tuple) -> tuple:
    n = t[0]
    return tuple(decode_column(c, n) for c in t[1:])


def encode_label_rows(batch: LabelRows) -> bytes:
    return tagged(_code(batch.columns(), _ROW_KINDS), batch)


def decode_label_rows(data: bytes) -> LabelRows:
    return untagged(data, lambda t: LabelRows(*_decode(t)))


def _estimated_size(columns: tuple) -> int:
    """Coded size of equal-length columns, from their first values (for Beam's size counters)."""
    if not columns or not columns[0]:
        return 8
    first = tuple(column[0] for column in columns)
    return 8 + len(columns[0]) * len(tagged(first, first))


class LabelRowsCoder(TupleCoder):
    _type, _encode, _decode = LabelRows, encode_label_rows, decode_label_rows
    _estimate = lambda batch: _estimated_size(batch.columns())  # noqa: E731


def encode_join_part(part: JoinPart) -> bytes:
    files = part.files.columns()
    root = root_of(files[1], files[2])
    if root is not None:
        files = (files[0], (), *files[2:])
    return tagged((root, _code(files, _FILE_KINDS), _code(part.rows.columns(), _ROW_KINDS)), part)


def decode_join_part(data: bytes) -> JoinPart:
    def build(t: tuple) -> JoinPart:
        root, files, rows = t
        keys, paths, relpaths, sizes = _decode(files)
        paths = paths if root is None else rooted_paths(root, relpaths)
        return JoinPart(KeyedFiles(keys, paths, relpaths, sizes), LabelRows(*_decode(rows)))

    return untagged(data, build)


class JoinPartCoder(TupleCoder):
    _type, _encode, _decode = JoinPart, encode_join_part, decode_join_part
    _estimate = lambda part: _estimated_size(part.files.columns()) + _estimated_size(part.rows.columns())  # noqa: E731


class Listed:
    """Type of the elements of JoinedLabels.listed: RecordBatches and Failures (ListedCoder)."""


def encode_listed(item: RecordBatch | Failure) -> bytes:
    if type(item) is RecordBatch:
        return b"R" + encode_record_batch(item)
    return b"P" + pickle.dumps(item, protocol=4)


def decode_listed(data: bytes) -> RecordBatch | Failure:
    return decode_record_batch(data[1:]) if data[:1] == b"R" else pickle.loads(data[1:])


def estimate_listed(item: RecordBatch | Failure) -> int:
    return estimate_record_batch(item) if type(item) is RecordBatch else 200


class ListedCoder(TupleCoder):
    _type, _encode, _decode, _estimate = Listed, encode_listed, decode_listed, estimate_listed


class OrphanLinesCoder(TupleCoder):
    _type = OrphanLines
    _encode = lambda o: tagged((o.chunk, o.lines), o)  # noqa: E731
    _decode = lambda data: untagged(data, lambda t: OrphanLines(*t))  # noqa: E731
    _estimate = lambda o: _estimated_size((o.lines,))  # noqa: E731


# Record type -> its coder (registered by beam_pipeline/pipeline.py `register_coders`).
CODERS = {
    Listed: ListedCoder,
    OrphanLines: OrphanLinesCoder,
    LabelRows: LabelRowsCoder,
    JoinPart: JoinPartCoder,
}
