"""The join's key buckets and the flat coding of its columns (pure).

A key's bucket is the range its hash falls in, `crc32(key) * buckets >> 32` (as TFDS assigns
shards from hashed keys), out of a count that grows with the data (bucket_count), so each
bucket holds about `per_bucket` images and rows. bucket_parts splits a batch of columns
(LabelRows' or KeyedFiles', the keys first) into the items of each bucket.

How a column crosses a shuffle (code_column; decode_column reverses it):
- text (keys, paths, relpaths) as one UTF-8 blob of its values joined by NUL (a column
  holding a NUL itself is kept as a tuple; undecodable bytes of a file name, surrogates, go
  through as they are);
- ints (sizes, lines) as one array of little-endian int64;
- labels, splits, sources and errors by coders.dictionary_code (the codec of RecordBatches);
- anything else (the extras) as the tuple it is (packed when all empty: their numbers may be
  1, 1.0 or True, which are equal but not the same).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from operator import itemgetter, methodcaller

import numpy as np

from transforms.coders import dictionary_code, dictionary_decode
from transforms.records import BATCH_SIZE

TEXT, INTS, FEW, ANY = "text", "ints", "few", "any"  # how each column is coded
FILE_KINDS = (TEXT, TEXT, TEXT, INTS)  # KeyedFiles: keys, paths, relpaths, sizes
ROW_KINDS = (TEXT, FEW, FEW, ANY, FEW, INTS, FEW)  # LabelRows' seven columns
_SEP = "\x00"
_INT64 = np.dtype("<i8")
_KEY_BYTES = methodcaller("encode", "utf-8", "surrogateescape")  # a key as hashed


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


def bucket_count(images: int, rows: int, per_bucket: int = BATCH_SIZE) -> int:
    """Buckets of the join: enough that each holds about `per_bucket` images or rows."""
    return max(1, -(-max(images, rows) // per_bucket))


def bucket_parts(columns: Sequence[Sequence], buckets: int) -> Iterator[tuple[int, tuple[tuple, ...]]]:
    """(bucket, its items as columns) for the items given as columns (the keys first), in
    bucket order, each bucket's items in their order: one crc32 a key, one stable numpy sort,
    each column gathered once by one C call (itemgetter) and sliced by bucket."""
    n = len(columns[0])
    if buckets == 1 or n == 1:
        if n:
            yield zlib.crc32(_KEY_BYTES(columns[0][0])) * buckets >> 32, tuple(map(tuple, columns))
        return
    hashes = np.fromiter(map(zlib.crc32, map(_KEY_BYTES, columns[0])), dtype=np.uint64, count=n)
    of = (hashes * np.uint64(buckets)) >> np.uint64(32)
    order = np.argsort(of, kind="stable")
    of = of[order]
    gather = itemgetter(*order.tolist())
    gathered = [gather(column) for column in columns]
    bounds = [0, *(np.flatnonzero(np.diff(of)) + 1).tolist(), n]
    for start, end in zip(bounds, bounds[1:]):
        yield int(of[start]), tuple(column[start:end] for column in gathered)
