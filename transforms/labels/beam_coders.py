"""Coders of the labels-table batches that cross a shuffle: their columns coded flat, a
few values a batch, never one coder call (or Python object) per row.

In: LabelRows, KeyedFiles, JoinPart, OrphanRow, OrphanLines, and JoinedLabels.listed's items. Out: bytes.
A batch is coded as a handful of flat columns (`code_column`), then the primitive coder codes
that small tuple once:
- a column of text (keys, paths, relpaths) as one UTF-8 blob of its values joined by NUL
  (decoded with one split; a column holding a NUL itself is coded as a tuple);
- a column of ints (sizes, lines) as one array of int64;
- a column of few distinct values (labels, splits, sources, errors) as those values and one
  array of their indices, or the value alone when all are equal;
- the extras column as it is (packed when all empty: its numbers may be 1, 1.0 or True,
  which are equal but not the same).
Undecodable bytes of a file name (surrogates) go through the blobs as they are
(surrogatepass); a batch the primitive coder still cannot code is pickled (coders.tagged).
"""

from __future__ import annotations

import pickle
import sys
from array import array
from operator import itemgetter

from apache_beam import coders

from transforms.coders import (
    TupleCoder,
    decode_record_batch,
    encode_record_batch,
    estimate_record_batch,
    tagged,
    untagged,
)
from transforms.failures import Failure
from transforms.labels.rows import JoinPart, KeyedFiles, LabelRows, OrphanLines, OrphanRow
from transforms.records import RecordBatch

TEXT, INTS, FEW, ANY = "text", "ints", "few", "any"  # how each column is coded
_SEP = "\x00"
_LITTLE = sys.byteorder == "little"
_FILE_KINDS = (TEXT, TEXT, TEXT, INTS)  # KeyedFiles: keys, paths, relpaths, sizes
_ROW_KINDS = (TEXT, FEW, FEW, ANY, FEW, INTS, FEW)  # LabelRows' seven columns


def _int_array(code: str, values: object) -> bytes:
    a = array(code, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _from_int_array(code: str, data: bytes) -> array:
    a = array(code)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


def code_column(column: tuple, kind: str) -> tuple:
    """One column as a few flat values (see the module docstring); decode_column reverses it."""
    n = len(column)
    if n > 1 and kind in (FEW, ANY) and column.count(column[0]) == n:
        first = column[0]
        if kind == FEW or first == ():
            return ("=", first)
    if kind == TEXT and n:
        try:
            text = _SEP.join(column)
        except TypeError:
            return ("t", column)
        if text.count(_SEP) == n - 1:
            return ("s", text.encode("utf-8", "surrogatepass"))
    elif kind == INTS:  # ints by construction (sizes, line numbers)
        try:
            return ("q", _int_array("q", column))
        except (TypeError, OverflowError):
            pass
    elif kind == FEW and n > 1 and len(set(column[:64])) <= 16:  # few distinct, judged on a sample
        distinct = dict.fromkeys(column)  # str, None or tuples of str: equal means the same
        if len(distinct) < n // 2:
            index = {value: i for i, value in enumerate(distinct)}
            return ("d", tuple(distinct), _int_array("I", map(index.__getitem__, column)))
    return ("t", column)


def decode_column(coded: tuple, n: int) -> tuple:
    """The column that code_column coded, `n` values long."""
    how = coded[0]
    if how == "s":
        return tuple(coded[1].decode("utf-8", "surrogatepass").split(_SEP))
    if how == "q":
        return tuple(_from_int_array("q", coded[1]))
    if how == "=":
        return (coded[1],) * n
    if how == "d":
        indices = _from_int_array("I", coded[2])
        return itemgetter(*indices)(coded[1]) if n > 1 else (coded[1][indices[0]],)
    return coded[1]


def _code(columns: tuple, kinds: tuple) -> tuple:
    return (len(columns[0]) if columns else 0, *map(code_column, columns, kinds))


def _decode(t: tuple) -> tuple:
    n = t[0]
    return tuple(decode_column(c, n) for c in t[1:])


def encode_label_rows(batch: LabelRows) -> bytes:
    return tagged(_code(batch.columns(), _ROW_KINDS), batch)


def decode_label_rows(data: bytes) -> LabelRows:
    return untagged(data, lambda t: LabelRows(*_decode(t)))


def encode_keyed_files(files: KeyedFiles) -> bytes:
    return tagged(_code(files.columns(), _FILE_KINDS), files)


def decode_keyed_files(data: bytes) -> KeyedFiles:
    return untagged(data, lambda t: KeyedFiles(*_decode(t)))


def encode_join_part(part: JoinPart) -> bytes:
    return tagged((_code(part.files.columns(), _FILE_KINDS), _code(part.rows.columns(), _ROW_KINDS)), part)


def decode_join_part(data: bytes) -> JoinPart:
    return untagged(data, lambda t: JoinPart(KeyedFiles(*_decode(t[0])), LabelRows(*_decode(t[1]))))


def _estimated_size(columns: tuple) -> int:
    """Coded size of equal-length columns, from their first values (for Beam's size counters)."""
    if not columns or not columns[0]:
        return 8
    first = tuple(column[0] for column in columns)
    return 8 + len(columns[0]) * len(tagged(first, first))


def estimate_label_rows(batch: LabelRows) -> int:
    return _estimated_size(batch.columns())


def estimate_keyed_files(files: KeyedFiles) -> int:
    return _estimated_size(files.columns())


def estimate_join_part(part: JoinPart) -> int:
    return _estimated_size(part.files.columns()) + _estimated_size(part.rows.columns())


class LabelRowsCoder(TupleCoder):
    _type, _encode, _decode, _estimate = LabelRows, encode_label_rows, decode_label_rows, estimate_label_rows


class KeyedFilesCoder(TupleCoder):
    _type, _encode, _decode, _estimate = (
        KeyedFiles,
        encode_keyed_files,
        decode_keyed_files,
        estimate_keyed_files,
    )


class JoinPartCoder(TupleCoder):
    _type, _encode, _decode, _estimate = JoinPart, encode_join_part, decode_join_part, estimate_join_part


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


def encode_orphan(o: OrphanRow) -> bytes:
    return tagged((o.key, o.source, o.line, o.reason, o.first), o)


def decode_orphan(data: bytes) -> OrphanRow:
    return untagged(data, lambda t: OrphanRow(*t))


class OrphanRowCoder(TupleCoder):
    _type, _encode, _decode = OrphanRow, encode_orphan, decode_orphan


def encode_orphan_lines(o: OrphanLines) -> bytes:
    return tagged((o.chunk, o.lines), o)


def decode_orphan_lines(data: bytes) -> OrphanLines:
    return untagged(data, lambda t: OrphanLines(*t))


def estimate_orphan_lines(o: OrphanLines) -> int:
    return 8 + len(o.lines) * (len(tagged(o.lines[0], o.lines[0])) if o.lines else 0)


class OrphanLinesCoder(TupleCoder):
    _type, _encode, _decode, _estimate = (
        OrphanLines,
        encode_orphan_lines,
        decode_orphan_lines,
        estimate_orphan_lines,
    )


coders.registry.register_coder(Listed, ListedCoder)


coders.registry.register_coder(OrphanRow, OrphanRowCoder)


coders.registry.register_coder(OrphanLines, OrphanLinesCoder)


coders.registry.register_coder(LabelRows, LabelRowsCoder)


coders.registry.register_coder(JoinPart, JoinPartCoder)


coders.registry.register_coder(KeyedFiles, KeyedFilesCoder)
