"""Cheap, deterministic Beam coders for the records that go through shuffles.

Without them Beam pickles a record (~2 us, the class path in every element). Here a record is
the tuple of its fields, coded by Beam's compiled FastPrimitivesCoder (~0.3 us), or pickled
behind a tag byte when it cannot be (surrogates of undecodable file names), so every record
round-trips exactly. A batch is one coder call on its columns with the repeats taken out: paths
as one root when each is root + relpath, labels, splits and extras as a table and a byte or two
a record (`dictionary_code`). Registered in one place: beam_pipeline/pipeline.py
`register_coders` (CODERS).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam import coders

from transforms.beam_internals import CacheAware
from transforms.failures import Failure
from transforms.objects import Objects
from transforms.records import FileBatch, ImageRecord, RecordBatch, ShardTask, root_of, rooted_paths

_FIELDS = coders.FastPrimitivesCoder().get_impl()
_AS_TUPLE = b"\x00"
_AS_PICKLE = b"\x01"


def tagged(fields: Any, value: Any) -> bytes:
    """`fields` coded by the primitive coder, or `value` pickled if it cannot be."""
    try:
        return _AS_TUPLE + _FIELDS.encode(fields)
    except UnicodeEncodeError:  # surrogates (undecodable bytes of a file name)
        return _AS_PICKLE + pickle.dumps(value, protocol=4)


def untagged(data: bytes, build: Any) -> Any:
    """The value `tagged` coded: unpickled, or `build(fields)`."""
    if data[:1] == _AS_PICKLE:
        return pickle.loads(data[1:])
    return build(_FIELDS.decode(data[1:]))


def estimate(columns: Sequence[Sequence]) -> int:
    """Coded size of equal-length columns from their first row (Beam samples element sizes)."""
    if not columns or not columns[0]:
        return 16
    first = tuple(column[0] for column in columns)
    return 16 + len(columns[0]) * len(tagged(first, first))


def _paths_fields(paths: Sequence[str], relpaths: Sequence[str]) -> tuple[str, Sequence[str] | None]:
    """(root, None) when every path is `root + relpath` (a listing's files, one root), else ("", paths)."""
    root = root_of(paths, relpaths)
    return ("", paths) if root is None else (root, None)


# Width in bytes of a dictionary code -> its numpy type (little-endian on every machine).
_CODE_TYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dictionary_code(column: Sequence) -> tuple[Sequence, bytes | None]:
    """A column as (its distinct values, each value's index in them as bytes). Codes b"": one
    distinct value (or none). Codes None: the table is the column itself (unhashable values, or
    mostly distinct ones, where a table saves no bytes and costs a dict entry a record)."""
    if not column or column.count(column[0]) == len(column):
        return tuple(column[:1]), b""
    try:
        if len(set(column)) > len(column) // 2:
            return column, None
    except TypeError:  # an unhashable value (extras are free-form)
        return column, None
    index: dict = {}
    codes = [index.setdefault(v, len(index)) for v in column]
    width = 1 if len(index) <= 2**8 else 2 if len(index) <= 2**16 else 4  # the fewest bytes
    return tuple(index), np.asarray(codes, _CODE_TYPES[width]).tobytes()


def dictionary_decode(table: Sequence, codes: bytes | None, n: int) -> Sequence:
    """The column of `n` values that dictionary_code coded."""
    if codes is None:
        return table
    if not codes:
        return table * n
    return tuple(map(table.__getitem__, np.frombuffer(codes, _CODE_TYPES[len(codes) // n]).tolist()))


def objects_fields(objects: Sequence[Objects | None]) -> tuple[bytes | None, ...]:
    """A column of Objects (or None) as their bytes (Objects.to_bytes: compact and deterministic)."""
    return tuple([None if o is None else o.to_bytes() for o in objects])


def objects_column(fields: Sequence[bytes | None]) -> tuple[Objects | None, ...]:
    return tuple([None if b is None else Objects.from_bytes(b) for b in fields])


def encode_image_record(r: ImageRecord) -> bytes:
    """The fields; a record with objects adds their bytes (a classification record is coded as before)."""
    fields = (r.path, r.relpath, r.size, r.labels, r.split, r.extras)
    return tagged(fields if r.objects is None else (*fields, r.objects.to_bytes()), r)


def _image_record(fields: Sequence) -> ImageRecord:
    if len(fields) == 7:
        return ImageRecord(*fields[:6], Objects.from_bytes(fields[6]))
    return ImageRecord(*fields)


def decode_image_record(data: bytes) -> ImageRecord:
    return untagged(data, _image_record)


def encode_file_batch(batch: FileBatch) -> bytes:
    """(root, paths or None, relpaths, sizes): the paths as their root, as a RecordBatch's."""
    paths, relpaths, sizes = batch.columns()
    return tagged((*_paths_fields(paths, relpaths), relpaths, sizes), batch)


def decode_file_batch(data: bytes) -> FileBatch:
    return untagged(data, lambda t: FileBatch.from_columns(t[1] or rooted_paths(t[0], t[2]), t[2], t[3]))


def record_batch_fields(batch: RecordBatch) -> tuple:
    """What a RecordBatch is coded as: its columns with the repeats taken out, hashes and seed
    (a tiny image's record ~47 bytes instead of ~140, in every copy a runner holds), then the
    objects' bytes only when the batch has objects (a classification batch is coded as before)."""
    fields = (
        *_paths_fields(batch.paths, batch.relpaths),
        batch.relpaths,
        batch.sizes,
        *dictionary_code(batch.labels),
        *dictionary_code(batch.splits),
        *dictionary_code(batch.extras),
        batch.hashes,
        batch.hash_seed,
    )
    return fields if batch.objects is None else (*fields, objects_fields(batch.objects))


def _record_batch(fields: Sequence) -> RecordBatch:
    root, paths, relpaths, sizes, labels, label_codes, splits, split_codes, extras, extra_codes, *rest = (
        fields
    )
    n = len(relpaths)
    columns = (
        relpaths,
        sizes,
        dictionary_decode(labels, label_codes, n),
        dictionary_decode(splits, split_codes, n),
        dictionary_decode(extras, extra_codes, n),
        *rest[:2],
    )
    objects = objects_column(rest[2]) if len(rest) > 2 else None
    paths = rooted_paths(root, relpaths) if paths is None else paths
    return RecordBatch.from_columns(paths, *columns, objects=objects)


def encode_record_batch(batch: RecordBatch) -> bytes:
    return tagged(record_batch_fields(batch), batch)


def decode_record_batch(data: bytes) -> RecordBatch:
    return untagged(data, _record_batch)


def estimate_record_batch(batch: RecordBatch) -> int:
    size = estimate(batch.columns()) + (len(batch.hashes) if batch.hashes else 0)
    if batch.objects is not None:
        size += len(batch) * len(tagged(objects_fields(batch.objects[:1]), None))
    return size


def encode_shard_task(task: ShardTask) -> bytes:
    """(split, index, the batch's record_batch_fields)."""
    return tagged((task.split, task.index, *record_batch_fields(task.batch)), task)


def decode_shard_task(data: bytes) -> ShardTask:
    return untagged(data, lambda t: ShardTask(t[0], t[1], _record_batch(t[2:])))


class TupleCoder(coders.Coder):
    """Base: a record coded by the functions `_encode` and `_decode` (set per subclass)."""

    _type: type
    _encode: Any
    _decode: Any
    _estimate: Any = None  # a cheap size estimate, where a full encode would be costly

    def encode(self, value: Any) -> bytes:
        return type(self)._encode(value)

    def decode(self, encoded: bytes) -> Any:
        return type(self)._decode(encoded)

    def estimate_size(self, value: Any) -> int:
        estimate = type(self)._estimate
        return len(self.encode(value)) if estimate is None else estimate(value)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> type:
        return self._type


class ImageRecordCoder(TupleCoder):
    _type, _encode, _decode = ImageRecord, encode_image_record, decode_image_record


class ShardTaskCoder(TupleCoder):
    _type, _encode, _decode = ShardTask, encode_shard_task, decode_shard_task

    def estimate_size(self, task: ShardTask) -> int:
        return estimate_record_batch(task.batch)


class FileBatchCoder(TupleCoder):
    _type, _encode, _decode = FileBatch, encode_file_batch, decode_file_batch

    def estimate_size(self, batch: FileBatch) -> int:
        return estimate(batch.columns())


class RecordBatchCoder(TupleCoder):
    _type, _encode, _decode, _estimate = (
        RecordBatch,
        encode_record_batch,
        decode_record_batch,
        estimate_record_batch,
    )


# Schema metadata of a batch coded with its all-null columns left out: the batch's own schema.
_ARROW_SCHEMA = b"img2tfrecord.schema"


def encode_arrow_batch(batch: pa.RecordBatch) -> bytes:
    """One Arrow IPC stream (the schema, then the buffers as they are in memory: no value is
    made a Python object); a column null in every row (a table without a split column, rows
    without errors) goes as Arrow's null type, with no buffers at all."""
    empty = [i for i, c in enumerate(batch.columns) if c.null_count == len(c) > 0 and c.type != pa.null()]
    if empty:
        schema = batch.schema
        columns = [pa.nulls(len(c)) if i in empty else c for i, c in enumerate(batch.columns)]
        fields = [pa.field(f.name, pa.null()) if i in empty else f for i, f in enumerate(schema)]
        meta = {**(schema.metadata or {}), _ARROW_SCHEMA: schema.serialize().to_pybytes()}
        batch = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, metadata=meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_arrow_batch(data: bytes) -> pa.RecordBatch:
    """The batch encode_arrow_batch coded, its buffers read in place from `data` (no copy)."""
    batch = pa.ipc.open_stream(data).read_next_batch()
    meta = batch.schema.metadata or {}
    if _ARROW_SCHEMA not in meta:
        return batch
    schema = pa.ipc.read_schema(pa.py_buffer(meta[_ARROW_SCHEMA]))
    columns = [
        pa.nulls(batch.num_rows, f.type) if c.type != f.type else c for c, f in zip(batch.columns, schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class ArrowBatchCoder(TupleCoder):
    """A pyarrow RecordBatch (the labels' table rows, listed images and orphan rows)."""

    _type, _encode, _decode = pa.RecordBatch, encode_arrow_batch, decode_arrow_batch
    _estimate = lambda batch: 512 + batch.nbytes  # noqa: E731


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


class _Unwalked(CacheAware):
    """Sized by Beam's state cache without a walk of its objects (transforms/beam_internals.py):
    its items are small strings, ints and numpy arrays."""

    def get_referents_for_cache(self) -> list:
        return []


class SideDict(dict, _Unwalked):
    """A dict made to be a side input (totals, bucket tables, per-class counts), coded as a plain dict."""


class SideList(list, _Unwalked):
    """A list made to be a side input (class names), coded as a plain list."""


class SideDictCoder(TupleCoder):
    """SideDict (or SideList) as the primitive coder's dict (list), not pickled."""

    _type, _plain = SideDict, dict

    def encode(self, value: Any) -> bytes:
        return _FIELDS.encode(self._plain(value))

    def decode(self, encoded: bytes) -> Any:
        return self._type(_FIELDS.decode(encoded))

    def is_deterministic(self) -> bool:
        return False


class SideListCoder(SideDictCoder):
    _type, _plain = SideList, list


# Record type -> its coder (registered by beam_pipeline/pipeline.py `register_coders`).
CODERS = {
    ImageRecord: ImageRecordCoder,
    ShardTask: ShardTaskCoder,
    FileBatch: FileBatchCoder,
    RecordBatch: RecordBatchCoder,
    SideDict: SideDictCoder,
    SideList: SideListCoder,
    pa.RecordBatch: ArrowBatchCoder,
    Listed: ListedCoder,
}
