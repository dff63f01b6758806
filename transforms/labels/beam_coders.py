"""Coders of the labels-table batches that cross a shuffle: their columns, coded by Beam's
compiled FastPrimitivesCoder (no pickling, no object per row)."""

from __future__ import annotations

import pickle

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
from transforms.labels.rows import JoinPart, KeyedFiles, LabelRows, OrphanRow
from transforms.records import RecordBatch


def _pack(column: tuple, default: object) -> tuple:
    """A column whose values are all `default` as (default,); any other column as it is.

    Only for columns of str or None values (and empty tuples), where equal means the same
    value: a column of numbers is never packed (1, 1.0 and True are equal)."""
    if len(column) > 1 and column.count(default) == len(column):
        return (default,)
    return column


def _unpack(column: tuple, n: int) -> tuple:
    return column * n if len(column) == 1 and n > 1 else column


def _row_columns(batch: LabelRows) -> tuple:
    """The columns as coded: splits, extras, sources and errors packed when all alike."""
    keys, labels, splits, extras, sources, lines, errors = batch.columns()
    source = sources[0] if sources else ""
    return (
        keys,
        labels,
        _pack(splits, None),
        _pack(extras, ()),
        _pack(sources, source),
        lines,
        _pack(errors, None),
    )


def _rows_of(t: tuple) -> LabelRows:
    n = len(t[0])
    return LabelRows(t[0], t[1], _unpack(t[2], n), _unpack(t[3], n), _unpack(t[4], n), t[5], _unpack(t[6], n))


def encode_label_rows(batch: LabelRows) -> bytes:
    return tagged(_row_columns(batch), batch)


def decode_label_rows(data: bytes) -> LabelRows:
    return untagged(data, _rows_of)


def encode_keyed_files(files: KeyedFiles) -> bytes:
    return tagged(files.columns(), files)


def decode_keyed_files(data: bytes) -> KeyedFiles:
    return untagged(data, lambda t: KeyedFiles(*t))


def encode_join_part(part: JoinPart) -> bytes:
    return tagged((part.files.columns(), _row_columns(part.rows)), part)


def decode_join_part(data: bytes) -> JoinPart:
    return untagged(data, lambda t: JoinPart(KeyedFiles(*t[0]), _rows_of(t[1])))


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


coders.registry.register_coder(Listed, ListedCoder)


coders.registry.register_coder(OrphanRow, OrphanRowCoder)


coders.registry.register_coder(LabelRows, LabelRowsCoder)


coders.registry.register_coder(JoinPart, JoinPartCoder)


coders.registry.register_coder(KeyedFiles, KeyedFilesCoder)
