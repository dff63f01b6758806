"""The join's key buckets (pure): items sorted by key hash, coded flat, cut into parts.

In: LabelRows or KeyedFiles (the table's rows and the listed images, as columns). Out:
HashedColumns, the same items sorted by the crc32 of their key with each column coded flat
(code_column), and, once the bucket count is known, the parts of each bucket cut from them
(cut_parts), still coded; the join decodes a part once (join_part).

A key's bucket is the range its hash falls in, `crc32(key) * buckets >> 32` (as TFDS assigns
shards from hashed keys), so items sorted by hash are sorted by bucket for any bucket count:
they are hashed, sorted and coded where they are parsed or listed, before the counts exist
(fused with the parse and the listing, no stage boundary between), and a bucket's part is a
range of positions, cut from the coded columns by byte offsets. No Python object is made per
row or image between the parse (or the listing) and the join.

How a column is coded (code_column; decode_column reverses it):
- a column of text (keys, paths, relpaths) as one UTF-8 blob of its values joined by NUL
  (decoded with one split; a column holding a NUL itself is kept as a tuple);
- a column of ints (sizes, lines) as one array of little-endian int64;
- labels, splits, sources and errors by coders.dictionary_code (the codec of RecordBatches):
  their distinct values and an array of 1-4-byte indices (cut by position at the codes'
  width; a cut of fewer items than the values keeps its items' values instead), the value
  alone when all are equal, the tuple when most are distinct;
- anything else (the extras) as the tuple it is (packed when all empty: their numbers may be
  1, 1.0 or True, which are equal but not the same);
- the images' paths, when each is one root followed by its relpath, as that root (hash_sorted).
Undecodable bytes of a file name (surrogates) go through the blobs as they are (surrogatepass).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter, methodcaller

import numpy as np

from transforms.coders import dictionary_code, dictionary_decode, index_array, index_bytes
from transforms.labels.rows import HashedColumns, JoinPart, KeyedFiles, LabelRows
from transforms.records import BATCH_SIZE, root_of, rooted_paths

TEXT, INTS, FEW, ANY = "text", "ints", "few", "any"  # how each column is coded
FILE_KINDS = (TEXT, TEXT, TEXT, INTS)  # KeyedFiles: keys, paths, relpaths, sizes
ROW_KINDS = (TEXT, FEW, FEW, ANY, FEW, INTS, FEW)  # LabelRows' seven columns
_SEP = "\x00"
_INT64, _UINT32 = np.dtype("<i8"), np.dtype("<u4")
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


def key_hash(key: str) -> int:
    """The hash a join key is bucketed by: crc32 of its UTF-8 (the same on every worker;
    undecodable bytes of a file name hashed as they were)."""
    return zlib.crc32(_KEY_BYTES(key))


def bucket_of(key: str, buckets: int) -> int:
    """The join bucket of a key: the range of `buckets` equal ranges its hash falls in."""
    return key_hash(key) * buckets >> 32


def bucket_count(images: int, rows: int, per_bucket: int = BATCH_SIZE) -> int:
    """Buckets of the join: enough that each holds about `per_bucket` images or rows."""
    return max(1, -(-max(images, rows) // per_bucket))


def hash_sorted(columns: Sequence[Sequence], rows: bool) -> HashedColumns:
    """Items given as columns (LabelRows' or KeyedFiles', the keys first), sorted by the
    hash of their key (stable: equal hashes keep their order) and coded.

    One crc32 a key and one stable sort (numpy); a column of one value is not reordered, a
    column of ints or of few distinct values is reordered as its numpy array, any other is
    gathered in that order by one C call (itemgetter); the images' paths, when each is one
    root followed by its relpath (a listing's usual case), are coded as that root alone.
    """
    keys = columns[0]
    n = len(keys)
    hashes = np.fromiter(map(zlib.crc32, map(_KEY_BYTES, keys)), dtype=_UINT32, count=n)
    order = np.argsort(hashes, kind="stable")
    gather = itemgetter(*order.tolist()) if n > 1 else tuple
    kinds = ROW_KINDS if rows else FILE_KINDS
    coded = [_code_sorted(column, kind, order, gather) for column, kind in zip(columns, kinds)]
    if not rows:
        root = root_of(columns[1], columns[2])
        if root is not None:
            coded[1] = ("r", root)
    return HashedColumns(rows, n, tuple(coded), hashes[order].tobytes())


def _code_sorted(column: Sequence, kind: str, order: np.ndarray, gather: Callable) -> tuple:
    """code_column of the column reordered by `order` (gather: the same reordering).

    Values are read in the order they are held (a random order of a large column's objects
    misses the CPU's caches on each): a text column is coded whole, and its values' bytes,
    split apart, are reordered and joined again; ints and dictionary codes are reordered as
    numpy arrays.
    """
    n = len(column)
    if kind == TEXT and n > 1:
        coded = code_column(column, kind)
        if coded[0] == "s":
            return ("s", _reordered_blob(coded[1], n, order, gather))
    elif kind == INTS:
        try:
            return ("q", np.array(column, dtype=_INT64)[order].tobytes())
        except (TypeError, OverflowError, ValueError):
            pass
    elif kind != TEXT:
        coded = code_column(column, kind)
        if coded[0] == "d":
            codes = coded[2]
            return ("d", coded[1], codes and index_array(codes, n)[order].tobytes())
    return code_column(gather(column), kind)


def _reordered_blob(blob: bytes, n: int, order: np.ndarray, gather: Callable) -> bytes:
    """A blob of n values joined by NUL (no NUL inside one), its values reordered: as rows
    of a numpy array when every value has the same length (ids often have), else split,
    gathered and joined again."""
    width = blob.find(b"\x00") + 1  # one value and its NUL
    if width and (len(blob) + 1) == n * width:
        table = np.frombuffer(blob + b"\x00", dtype=np.uint8).reshape(n, width)
        if not table[:, -1].any():  # every NUL at the end of a row: every value is that long
            return table[order].tobytes()[:-1]
    return b"\x00".join(gather(blob.split(b"\x00")))


def cut_parts(batch: HashedColumns, buckets: int, size: int) -> Iterator[tuple[int, HashedColumns]]:
    """The parts of a hash-sorted batch for `buckets` buckets: (bucket, part), each part the
    batch's items of one bucket (up to `size` of them), cut from the coded columns by
    position: no item is decoded."""
    n = batch.count
    if not n:
        return
    hashes = np.frombuffer(batch.hashes, dtype=_UINT32).astype(np.uint64)
    of = (hashes * np.uint64(buckets)) >> np.uint64(32)
    starts = np.flatnonzero(np.diff(of)) + 1
    bounds = [0, *starts.tolist(), n]
    cutters = [_cutter(coded, n) for coded in batch.columns]
    first = of[bounds[:-1]].tolist()
    for bucket, start, end in zip(first, bounds, bounds[1:]):
        for cut in range(start, end, size):
            stop = min(cut + size, end)
            yield bucket, HashedColumns(batch.rows, stop - cut, tuple(c(cut, stop) for c in cutters))


def _cutter(coded: tuple, n: int) -> Callable[[int, int], tuple]:
    """A function (start, stop) -> the coded column of those positions only."""
    how = coded[0]
    if how == "s":
        blob = coded[1]
        seps = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 0)
        begins = [0, *(seps + 1).tolist()]
        ends = [*seps.tolist(), len(blob)]
        return lambda start, stop: ("s", blob[begins[start] : ends[stop - 1]])
    if how == "q":
        data = coded[1]
        return lambda start, stop: ("q", data[8 * start : 8 * stop])
    if how == "r" or (how == "d" and not coded[2]):  # one root; one value
        return lambda start, stop: coded
    if how == "d":
        table, codes = coded[1], coded[2]
        width = len(codes) // n

        def cut_few(start: int, stop: int) -> tuple:
            part = codes[width * start : width * stop]
            if len(table) > stop - start:  # more values than the part has items: its values
                return ("t", tuple(dictionary_decode(table, part, stop - start)))
            return ("d", table, part)

        return cut_few
    values = coded[1]
    return lambda start, stop: ("t", tuple(values[start:stop]))


def concat_parts(parts: Sequence[HashedColumns]) -> HashedColumns:
    """Parts of one side (rows or images) as one part, their columns still coded: blobs and
    arrays joined, few-value columns merged (their values once, the indices remapped); a
    column coded differently in the parts is decoded and kept as its values."""
    if len(parts) == 1:
        return parts[0]
    columns = []
    for i in range(len(parts[0].columns)):
        coded = [p.columns[i] for p in parts]
        hows = {c[0] for c in coded}
        if hows == {"s"}:
            columns.append(("s", b"\x00".join(c[1] for c in coded)))
        elif hows == {"q"}:
            columns.append(("q", b"".join(c[1] for c in coded)))
        elif hows == {"r"} and all(c == coded[0] for c in coded):
            columns.append(coded[0])  # one root throughout
        elif hows == {"d"}:
            columns.append(_merged_few(coded, [p.count for p in parts]))
        elif i == 1 and not parts[0].rows:  # paths, some coded as their root
            columns.append(("t", tuple(path for p in parts for path in join_part(p).files.paths)))
        else:
            columns.append(("t", tuple(v for c, p in zip(coded, parts) for v in decode_column(c, p.count))))
    return HashedColumns(parts[0].rows, sum(p.count for p in parts), tuple(columns))


def _merged_few(coded: Sequence[tuple], counts: Sequence[int]) -> tuple:
    """Columns coded "d" as one: each distinct value once, the codes remapped."""
    values: dict = {}
    indices = []
    for (_, table, codes), n in zip(coded, counts):
        remap = np.fromiter(
            (values.setdefault(v, len(values)) for v in table), dtype=np.uint32, count=len(table)
        )
        indices.append(remap[index_array(codes, n)] if codes else np.full(n, remap[0], dtype=np.uint32))
    return ("d", tuple(values), index_bytes(np.concatenate(indices), len(values)))


def join_part(part: HashedColumns) -> JoinPart:
    """A part's items decoded, as the JoinPart the join takes."""
    n, coded = part.count, part.columns
    if part.rows:
        return JoinPart(rows=LabelRows(*(decode_column(c, n) for c in coded)))
    keys, relpaths, sizes = (decode_column(coded[i], n) for i in (0, 2, 3))
    if coded[1][0] == "r":  # each path is the root and its relpath
        root = coded[1][1]
        paths = rooted_paths(root, relpaths)
    else:
        paths = decode_column(coded[1], n)
    return JoinPart(files=KeyedFiles(keys, paths, relpaths, sizes))
