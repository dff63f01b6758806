"""Coders of the labels-table batches that cross a shuffle: their columns coded flat, a
few values a batch, never one coder call (or Python object) per row.

In: HashedColumns, LabelRows, KeyedFiles, OrphanLines, and
JoinedLabels.listed's items. Out: bytes. A batch is coded as a handful of flat columns
(buckets.code_column: text as one UTF-8 blob, ints as one array, few distinct values as an
index array), then the primitive coder codes that small tuple once; a HashedColumns is
already coded so. A batch the primitive coder still cannot code is pickled (coders.tagged).
"""

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
from transforms.labels.buckets import FILE_KINDS as _FILE_KINDS
from transforms.labels.buckets import ROW_KINDS as _ROW_KINDS
from transforms.labels.buckets import code_column, decode_column
from transforms.labels.rows import HashedColumns, KeyedFiles, LabelRows, OrphanLines
from transforms.records import RecordBatch


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


class LabelRowsCoder(TupleCoder):
    _type, _encode, _decode, _estimate = LabelRows, encode_label_rows, decode_label_rows, estimate_label_rows


class KeyedFilesCoder(TupleCoder):
    _type, _encode, _decode, _estimate = (
        KeyedFiles,
        encode_keyed_files,
        decode_keyed_files,
        estimate_keyed_files,
    )


def encode_hashed(batch: HashedColumns) -> bytes:
    return tagged((batch.rows, batch.count, batch.columns, batch.hashes), batch)


def decode_hashed(data: bytes) -> HashedColumns:
    return untagged(data, lambda t: HashedColumns(*t))


def estimate_hashed(batch: HashedColumns) -> int:
    """The size of the blobs and arrays, and ~16 bytes an item for any column kept as values."""
    size = 16 + len(batch.hashes)
    for coded in batch.columns:
        size += (
            len(coded[-1]) if type(coded[-1]) is bytes else 16 * (len(coded[-1]) if coded[0] == "t" else 1)
        )
    return size


class HashedColumnsCoder(TupleCoder):
    _type, _encode, _decode, _estimate = HashedColumns, encode_hashed, decode_hashed, estimate_hashed


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


coders.registry.register_coder(OrphanLines, OrphanLinesCoder)


coders.registry.register_coder(LabelRows, LabelRowsCoder)


coders.registry.register_coder(KeyedFiles, KeyedFilesCoder)


coders.registry.register_coder(HashedColumns, HashedColumnsCoder)
