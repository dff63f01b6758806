"""Cheap, deterministic Beam coders for the records that go through shuffles.

Without them Beam codes a dataclass with pickle (FastPrimitivesCoder's fallback): about
2 us per record for each encode, size estimate and decode, with the class path in every
encoded record. Here a record is coded as the tuple of its fields by Beam's compiled
FastPrimitivesCoder (~0.3 us). A record it cannot code that way (a path with undecodable
bytes, kept as surrogates) is pickled instead, behind a tag byte, so every record
round-trips exactly. A batch (FileBatch, RecordBatch) is one coder call on the tuple of
its columns with their repeats taken out (the paths as one root when each is root +
relpath; labels, splits and extras as a table of distinct values and a byte or two a
record, or as they are when most values are distinct; a RecordBatch's seeded hashes as one
bytes value), decoded without building one object per image (a RecordBatch's paths are
built from its root only when read: RecordBatch.from_root); so is a ShardTask (its batch's columns,
the split column left out when every record is in the task's split). A size estimate (Beam samples element sizes for its counters, about every
element of a short PCollection) is one record's size times the count instead of a full
encode. Registered with Beam where a pipeline is built (beam_pipeline/pipeline.py
`register_coders`: CODERS here and in the stages' coder modules); a PCollection gets them when
its element type is declared (`with_output_types`). The labels table's batches (LabelRows,
JoinPart) are coded the same way by transforms/labels/beam_coders.py (TupleCoder, tagged).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
from apache_beam import coders

from transforms.beam_internals import CacheAware
from transforms.records import (
    FileBatch,
    ImageFile,
    ImageRecord,
    RecordBatch,
    ShardTask,
    root_of,
    rooted_paths,
)

_FIELDS = coders.FastPrimitivesCoder().get_impl()
_AS_TUPLE = b"\x00"
_AS_PICKLE = b"\x01"


def _record_fields(r: ImageRecord) -> tuple:
    return r.path, r.relpath, r.size, r.labels, r.split, r.extras


def file_fields(f: ImageFile) -> tuple:
    return f.path, f.relpath, f.size


def tagged(fields: Any, value: Any) -> bytes:
    """`fields` coded by the primitive coder, or `value` pickled if it cannot be."""
    try:
        return _AS_TUPLE + _FIELDS.encode(fields)
    except UnicodeEncodeError:  # surrogates (undecodable bytes of a file name)
        return _AS_PICKLE + pickle.dumps(value, protocol=4)


def untagged(data: bytes, build: Any) -> Any:
    if data[:1] == _AS_PICKLE:
        return pickle.loads(data[1:])
    return build(_FIELDS.decode(data[1:]))


def encode_image_file(f: ImageFile) -> bytes:
    return tagged(file_fields(f), f)


def decode_image_file(data: bytes) -> ImageFile:
    return untagged(data, lambda t: ImageFile(*t))


def encode_image_record(r: ImageRecord) -> bytes:
    return tagged(_record_fields(r), r)


def decode_image_record(data: bytes) -> ImageRecord:
    return untagged(data, lambda t: ImageRecord(*t))


def shard_task_fields(task: ShardTask) -> tuple:
    """What a ShardTask is coded as: (split, index, paths, relpaths, sizes, labels, splits, extras).

    `splits` is None when every record is in the task's split (always, from PlanShards).
    """
    paths, relpaths, sizes, labels, splits, extras = task.batch.columns()
    if all(s == task.split for s in splits):
        splits = None
    return task.split, task.index, paths, relpaths, sizes, labels, splits, extras


def _shard_task(fields: tuple) -> ShardTask:
    split, index, paths, relpaths, sizes, labels, splits, extras = fields
    splits = (split,) * len(paths) if splits is None else splits
    return ShardTask(split, index, RecordBatch.from_columns(paths, relpaths, sizes, labels, splits, extras))


def encode_shard_task(task: ShardTask) -> bytes:
    return tagged(shard_task_fields(task), task)


def decode_shard_task(data: bytes) -> ShardTask:
    return untagged(data, _shard_task)


def _paths_fields(paths: Sequence[str], relpaths: Sequence[str]) -> tuple[str, Sequence[str] | None]:
    """(root, None) when every path is `root + relpath` (a listing's files, one root), else ("", paths)."""
    root = root_of(paths, relpaths)
    return ("", paths) if root is None else (root, None)


def _paths(root: str, paths: Sequence[str] | None, relpaths: Sequence[str]) -> Sequence[str]:
    return rooted_paths(root, relpaths) if paths is None else paths


# Width in bytes of a dictionary code -> its numpy type (little-endian on every machine).
_CODE_TYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dictionary_code(column: Sequence) -> tuple[Sequence, bytes | None]:
    """A column as (its distinct values, each value's index in them, as bytes): the one
    dictionary coding of a column (RecordBatches here, the labels join's columns in
    labels/beam_coders.py).

    Codes b"": every value is the one distinct value (or the column is empty). Codes None:
    the table is the column itself (values that cannot be dict keys, or a column of mostly
    distinct values, such as the labels of a batch of GLDv2's 203,094 classes, where a table
    saves no bytes and costs a dict entry a record to build and a lookup to read).
    """
    if not column or column.count(column[0]) == len(column):
        return tuple(column[:1]), b""
    try:
        if len(set(column)) > len(column) // 2:  # mostly distinct: the column as it is
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


def file_batch_fields(batch: FileBatch) -> tuple:
    """What a FileBatch is coded as: (root, paths or None, relpaths, sizes), see record_batch_fields."""
    paths, relpaths, sizes = batch.columns()
    return (*_paths_fields(paths, relpaths), relpaths, sizes)


def encode_file_batch(batch: FileBatch) -> bytes:
    return tagged(file_batch_fields(batch), batch)


def decode_file_batch(data: bytes) -> FileBatch:
    return untagged(data, lambda t: FileBatch.from_columns(_paths(*t[:3]), t[2], t[3]))


def record_batch_fields(batch: RecordBatch) -> tuple:
    """What a RecordBatch is coded as: its columns with the repeats taken out, hashes and seed.

    A batch's paths are mostly its root plus each relpath (coded as the root alone), and its
    labels, splits and extras repeat a few values (coded as a table of the distinct values and
    a byte or two a record; a column of mostly distinct values as it is). A batch decoded
    from a root (RecordBatch.from_root) is coded as that root again, with no check. Tiny images' records are ~47 bytes coded instead of ~140 (72 of
    them the path): every copy of an encoded PCollection that a runner holds (the local
    runner holds 3-4 of a stage's input and output while the stage runs) is that much
    smaller. Read back by `record_batch_from_fields`.
    """
    relpaths, sizes, labels, splits, extras = (
        batch.relpaths,
        batch.sizes,
        batch.labels,
        batch.splits,
        batch.extras,
    )
    root = batch.root  # known when the batch was decoded from a root: no check, no paths built
    return (
        *((root, None) if root is not None else _paths_fields(batch.paths, relpaths)),
        relpaths,
        sizes,
        *dictionary_code(labels),
        *dictionary_code(splits),
        *dictionary_code(extras),
        batch.hashes,
        batch.hash_seed,
    )


def record_batch_from_fields(fields: Sequence) -> RecordBatch:
    """The RecordBatch of `record_batch_fields`."""
    (
        root,
        paths,
        relpaths,
        sizes,
        labels,
        label_codes,
        splits,
        split_codes,
        extras,
        extra_codes,
        hashes,
        seed,
    ) = fields
    n = len(relpaths)
    make = RecordBatch.from_root if paths is None else RecordBatch.from_columns
    return make(
        root if paths is None else paths,
        relpaths,
        sizes,
        dictionary_decode(labels, label_codes, n),
        dictionary_decode(splits, split_codes, n),
        dictionary_decode(extras, extra_codes, n),
        hashes,
        seed,
    )


def encode_record_batch(batch: RecordBatch) -> bytes:
    return tagged(record_batch_fields(batch), batch)


def decode_record_batch(data: bytes) -> RecordBatch:
    return untagged(data, record_batch_from_fields)


def estimate_shard_task(task: ShardTask) -> int:
    return _estimated_columns(len(task.batch), _first_row(task.batch.columns()))


def _first_row(columns: tuple) -> tuple:
    """The first value of each column (empty for an empty batch)."""
    return tuple(column[0] for column in columns) if columns[0] else ()


def _estimated_columns(n: int, first_row: tuple) -> int:
    """Coded size of `n` rows like `first_row` (for Beam's size counters; no full encode)."""
    try:
        return 16 + n * len(_FIELDS.encode(first_row)) if n else 16
    except UnicodeEncodeError:  # surrogates: coded by pickle, about as long
        return 16 + n * len(pickle.dumps(first_row, protocol=4))


def estimate_file_batch(batch: FileBatch) -> int:
    return _estimated_columns(len(batch), _first_row(batch.columns()))


def estimate_record_batch(batch: RecordBatch) -> int:
    hashes = len(batch.hashes) if batch.hashes else 0
    return _estimated_columns(len(batch), _first_row(batch.columns())) + hashes


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

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


class ImageFileCoder(TupleCoder):
    _type, _encode, _decode = ImageFile, encode_image_file, decode_image_file


class ImageRecordCoder(TupleCoder):
    _type, _encode, _decode = ImageRecord, encode_image_record, decode_image_record


class ShardTaskCoder(TupleCoder):
    _type, _encode, _decode, _estimate = ShardTask, encode_shard_task, decode_shard_task, estimate_shard_task


class FileBatchCoder(TupleCoder):
    _type, _encode, _decode, _estimate = FileBatch, encode_file_batch, decode_file_batch, estimate_file_batch


class RecordBatchCoder(TupleCoder):
    _type, _encode, _decode = RecordBatch, encode_record_batch, decode_record_batch
    _estimate = estimate_record_batch


class SideDict(dict, CacheAware):
    """A dict made to be a side input (totals, bucket tables, per-class counts).

    Beam's state cache sizes every side input it loads by walking all its objects (objsize:
    ~1 us an object, a 200,000-class table of [count, weight] lists is ~600,000 of them)
    for each stage that reads it. A SideDict is sized by its own table only (its keys and
    values are small strings and ints, about as many bytes again), and is coded as a plain
    dict by the compiled primitive coder.
    """

    def get_referents_for_cache(self) -> list:
        return []


class SideList(list, CacheAware):
    """A list made to be a side input (class names): sized like SideDict, without a walk."""

    def get_referents_for_cache(self) -> list:
        return []


class SideDictCoder(coders.Coder):
    """SideDict (or SideList) as the primitive coder's dict (list), not pickled."""

    _plain: type = dict
    _side: type = SideDict

    def encode(self, value: Any) -> bytes:
        return _FIELDS.encode(self._plain(value))

    def decode(self, encoded: bytes) -> Any:
        return self._side(_FIELDS.decode(encoded))

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return self._side

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


class SideListCoder(SideDictCoder):
    _plain, _side = list, SideList


# Record type -> its coder (registered by beam_pipeline/pipeline.py `register_coders`).
CODERS = {
    ImageFile: ImageFileCoder,
    ImageRecord: ImageRecordCoder,
    ShardTask: ShardTaskCoder,
    FileBatch: FileBatchCoder,
    RecordBatch: RecordBatchCoder,
    SideDict: SideDictCoder,
    SideList: SideListCoder,
}
