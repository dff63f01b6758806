"""Cheap, deterministic Beam coders for the records that go through shuffles.

Without them Beam pickles a record: ~2 us per encode, size estimate and decode, with the class
path in every element. Here a record is the tuple of its fields, coded by Beam's compiled
FastPrimitivesCoder (~0.3 us), or pickled behind a tag byte when it cannot be (a path with
undecodable bytes, kept as surrogates), so every record round-trips exactly. A batch is one
coder call on its columns with the repeats taken out: paths as one root when each is root +
relpath, a RecordBatch's labels, splits and extras as a table and a byte or two a record
(`dictionary_code`), a ShardTask's splits left out when all are the task's. A size estimate
(Beam samples element sizes) is one row's size times the count. Registered in one place:
beam_pipeline/pipeline.py `register_coders` (CODERS here and in labels/beam_coders.py).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
from apache_beam import coders

from transforms.beam_internals import CacheAware
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


def _estimate(n: int, columns: Sequence[Sequence]) -> int:
    """Coded size of `n` rows like the first of `columns` (no full encode)."""
    if not n:
        return 16
    first = tuple(column[0] for column in columns)
    try:
        return 16 + n * len(_FIELDS.encode(first))
    except UnicodeEncodeError:  # surrogates: coded by pickle, about as long
        return 16 + n * len(pickle.dumps(first, protocol=4))


def _paths_fields(paths: Sequence[str], relpaths: Sequence[str]) -> tuple[str, Sequence[str] | None]:
    """(root, None) when every path is `root + relpath` (a listing's files, one root), else ("", paths)."""
    root = root_of(paths, relpaths)
    return ("", paths) if root is None else (root, None)


# Width in bytes of a dictionary code -> its numpy type (little-endian on every machine).
_CODE_TYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dictionary_code(column: Sequence) -> tuple[Sequence, bytes | None]:
    """A column as (its distinct values, each value's index in them as bytes): the one dictionary
    coding (RecordBatches, and the labels join's columns: labels/beam_coders.py). Codes b"": every
    value is the one distinct value (or none). Codes None: the table is the column itself
    (unhashable values, or mostly distinct ones such as a batch of GLDv2's 203,094 classes'
    labels, where a table saves no bytes and costs a dict entry a record).
    """
    if not column or column.count(column[0]) == len(column):
        return tuple(column[:1]), b""
    try:
        if len(set(column)) > len(column) // 2:
            return column, None
    except TypeError:  # an unhashable value (extras are free-form)
        return column, None
    index: dict = {}
    codes = [index.setdefault(v, len(index)) for v in column]
    return tuple(index), index_bytes(codes, len(index))


def index_bytes(indices: Sequence[int] | np.ndarray, distinct: int) -> bytes:
    """Indices into a table of `distinct` values, 1, 2 or 4 bytes each (the fewest that hold them)."""
    width = 1 if distinct <= 2**8 else 2 if distinct <= 2**16 else 4
    return np.asarray(indices, _CODE_TYPES[width]).tobytes()


def index_array(codes: bytes, n: int) -> np.ndarray:
    """The `n` indices of dictionary_code's codes (not b"" nor None)."""
    return np.frombuffer(codes, _CODE_TYPES[len(codes) // n])


def dictionary_decode(table: Sequence, codes: bytes | None, n: int) -> Sequence:
    """The column of `n` values that dictionary_code coded."""
    if codes is None:
        return table
    if not codes:
        return table * n
    return tuple(map(table.__getitem__, index_array(codes, n).tolist()))


def encode_image_record(r: ImageRecord) -> bytes:
    return tagged((r.path, r.relpath, r.size, r.labels, r.split, r.extras), r)


def decode_image_record(data: bytes) -> ImageRecord:
    return untagged(data, lambda t: ImageRecord(*t))


def encode_shard_task(task: ShardTask) -> bytes:
    """(split, index, paths, relpaths, sizes, labels, splits or None, extras): splits None when
    every record is in the task's split (always, from PlanShards)."""
    paths, relpaths, sizes, labels, splits, extras = task.batch.columns()
    if all(s == task.split for s in splits):
        splits = None
    return tagged((task.split, task.index, paths, relpaths, sizes, labels, splits, extras), task)


def _shard_task(fields: tuple) -> ShardTask:
    split, index, paths, relpaths, sizes, labels, splits, extras = fields
    splits = (split,) * len(paths) if splits is None else splits
    return ShardTask(split, index, RecordBatch.from_columns(paths, relpaths, sizes, labels, splits, extras))


def decode_shard_task(data: bytes) -> ShardTask:
    return untagged(data, _shard_task)


def encode_file_batch(batch: FileBatch) -> bytes:
    """(root, paths or None, relpaths, sizes): the paths as their root, as a RecordBatch's."""
    paths, relpaths, sizes = batch.columns()
    return tagged((*_paths_fields(paths, relpaths), relpaths, sizes), batch)


def decode_file_batch(data: bytes) -> FileBatch:
    return untagged(data, lambda t: FileBatch.from_columns(t[1] or rooted_paths(t[0], t[2]), t[2], t[3]))


def record_batch_fields(batch: RecordBatch) -> tuple:
    """What a RecordBatch is coded as: its columns with the repeats taken out, hashes and seed.

    Tiny images' records are ~47 bytes coded instead of ~140 (72 of them the path), in every
    copy of a PCollection a runner holds (the local runner holds 3-4 of a stage's input and
    output). A batch decoded from a root (RecordBatch.from_root) is coded as that root again.
    """
    root = batch.root
    return (
        *((root, None) if root is not None else _paths_fields(batch.paths, batch.relpaths)),
        batch.relpaths,
        batch.sizes,
        *dictionary_code(batch.labels),
        *dictionary_code(batch.splits),
        *dictionary_code(batch.extras),
        batch.hashes,
        batch.hash_seed,
    )


def _record_batch(fields: Sequence) -> RecordBatch:
    root, paths, relpaths, sizes, labels, label_codes, splits, split_codes, extras, extra_codes, *hashes = (
        fields
    )
    n = len(relpaths)
    columns = (
        relpaths,
        sizes,
        dictionary_decode(labels, label_codes, n),
        dictionary_decode(splits, split_codes, n),
        dictionary_decode(extras, extra_codes, n),
        *hashes,
    )
    return (
        RecordBatch.from_root(root, *columns) if paths is None else RecordBatch.from_columns(paths, *columns)
    )


def encode_record_batch(batch: RecordBatch) -> bytes:
    return tagged(record_batch_fields(batch), batch)


def decode_record_batch(data: bytes) -> RecordBatch:
    return untagged(data, _record_batch)


def estimate_record_batch(batch: RecordBatch) -> int:
    return _estimate(len(batch), batch.columns()) + (len(batch.hashes) if batch.hashes else 0)


class TupleCoder(coders.Coder):
    """Base: a record coded by the functions `_encode` and `_decode` (set per subclass); equal to
    any coder of its class (Beam's Coder.__eq__: no state but its impl)."""

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
        return _estimate(len(task), task.batch.columns())


class FileBatchCoder(TupleCoder):
    _type, _encode, _decode = FileBatch, encode_file_batch, decode_file_batch

    def estimate_size(self, batch: FileBatch) -> int:
        return _estimate(len(batch), batch.columns())


class RecordBatchCoder(TupleCoder):
    _type, _encode, _decode, _estimate = (
        RecordBatch,
        encode_record_batch,
        decode_record_batch,
        estimate_record_batch,
    )


class SideDict(dict, CacheAware):
    """A dict made to be a side input (totals, bucket tables, per-class counts), sized by Beam's
    state cache without a walk of its objects (transforms/beam_internals.py: its keys and values
    are small strings and ints) and coded as a plain dict by the primitive coder."""

    def get_referents_for_cache(self) -> list:
        return []


class SideList(list, CacheAware):
    """A list made to be a side input (class names): sized like SideDict, without a walk."""

    def get_referents_for_cache(self) -> list:
        return []


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
}
