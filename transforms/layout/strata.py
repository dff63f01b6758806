"""Stratified splits in bounded groups (pure): which group a record of a class goes to, and its
split once its group is gathered.

Record i of a class of n (0-based in the seeded order: split hash, then relpath, then path) goes
to the first split whose cumulative ratio exceeds (i + 0.5) / n: exactly what sorting the whole
class would give (tests/layout/reference.py), without gathering it. Classes of up to `bucket`
records are packed whole, in class-name order, up to `bucket` records a group (GLDv2's 203,094
classes make ~N / `bucket` groups). A bigger class is cut into hash buckets of `bucket` / 2 to
`bucket` records on average, one group each; a bucket table's prefix sums give the rank of a
bucket's first record in its class. So no group grows with the number of images.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import numpy as np

# Group keys: (_PACK, "", pack number), or (_BUCKET, class, bucket) for a class above the pack size.
_PACK, _BUCKET = 0, 1


def class_bits(count: int, bucket: int) -> int:
    """The hash-bucket bits of a class of `count` records: 2**bits buckets of `bucket` / 2 to
    `bucket` records on average (0: the class is packed whole)."""
    return math.ceil(math.log2(count / bucket)) if count > bucket else 0


class Packs:
    """Where each class goes, from the class counts alone (the same on every worker): a pack
    of small classes, contiguous in class-name order (found by a binary search over each pack's
    first name), or hash bucket bits (a class above `bucket` records: few, a small dict)."""

    def __init__(self, counts: Mapping[str, int], bucket: int):
        self.firsts: list[str] = []  # the first (smallest) class name of each pack
        self.big: dict[str, int] = {}  # {class above `bucket` records: its hash bucket bits}
        held = None
        for name in sorted(counts):
            count = counts[name]
            if count > bucket:
                self.big[name] = class_bits(count, bucket)
                continue
            if held is None or held + count > bucket:
                self.firsts.append(name)
                held = 0
            held += count

    def pack_of(self, name: str) -> int:
        """The pack of a class of at most `bucket` records (a class not above it)."""
        return bisect.bisect_right(self.firsts, name) - 1


def group_keys(
    classes: Sequence[str],
    split_hashes: np.ndarray,
    packs: Packs,
) -> tuple[np.ndarray, list[tuple[int, str, int]]]:
    """Each record's group key, as (codes, keys): record i goes to keys[codes[i]], its class's
    pack or (a class above the pack size) its hash bucket; `keys` are distinct. One binary
    search per distinct class of the batch; per record, numpy."""
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(c, len(index)) for c in classes), np.int64, len(classes))
    names = list(index)
    big, pack_of = packs.big, packs.pack_of
    keys: dict[tuple[int, str, int], int] = {}
    key_of = np.full(len(names), -1, dtype=np.int64)  # a class's key, for the packed classes
    bits = np.zeros(len(names), dtype=np.int64)
    for code, name in enumerate(names):
        b = big.get(name)
        if b is None:
            key_of[code] = keys.setdefault((_PACK, "", pack_of(name)), len(keys))
        else:
            bits[code] = b
    out = key_of[codes]
    if bits.any():
        at = np.flatnonzero(bits[codes])
        buckets = (split_hashes[at] >> (64 - bits[codes[at]]).astype(np.uint64)).tolist()
        out[at] = [
            keys.setdefault((_BUCKET, names[c], b), len(keys)) for c, b in zip(codes[at].tolist(), buckets)
        ]
    return out, list(keys)


def bucket_starts(table: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """{(class, bucket): records of the class before that bucket}, from the bucket table
    ({(class, bucket): records}; the classes above the pack size only)."""
    starts, before, last = {}, 0, None
    for name, bucket in sorted(table):
        before = 0 if name != last else before
        starts[name, bucket], last = before, name
        before += table[name, bucket]
    return starts


def split_indexes_in_group(
    classes: Sequence[str],
    split_hashes: np.ndarray,
    relpaths: Sequence[str],
    paths: Sequence[str],
    counts: Mapping[str, int] | None,
    cumulative: Sequence[float],
    start: int = 0,
) -> np.ndarray:
    """Each record's split index, for the records of one group (in their given order).

    Args:
      classes, split_hashes, relpaths, paths: the group's records, as columns.
      counts: each class's whole record count; None for a pack (it holds its classes whole).
      cumulative: the cumulative split ratios.
      start: records of the class before this group (a hash bucket of a big class; 0 for a pack).
    """
    n = len(classes)
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(c, len(index)) for c in classes), np.int64, n)
    order = np.lexsort((split_hashes, codes))
    sorted_codes, sorted_hashes = codes[order], split_hashes[order]
    if n > 1 and bool(
        np.any((sorted_codes[1:] == sorted_codes[:-1]) & (sorted_hashes[1:] == sorted_hashes[:-1]))
    ):
        # Equal hashes in a class (never seen in practice): ties broken by relpath, then path.
        hashes = split_hashes.tolist()
        order = np.array(
            sorted(range(n), key=lambda i: (codes[i], hashes[i], relpaths[i], paths[i])), dtype=np.int64
        )
        sorted_codes = codes[order]
    firsts = np.flatnonzero(np.concatenate(([True], sorted_codes[1:] != sorted_codes[:-1])))
    runs = np.diff(np.append(firsts, n))
    ranks = np.arange(n) - np.repeat(firsts, runs) + start
    if counts is None:
        totals = np.bincount(codes, minlength=len(index))[sorted_codes]
    else:
        totals = np.array([counts[name] for name in index], dtype=np.int64)[sorted_codes]
    # The first split whose cumulative ratio exceeds (2 * rank + 1) / (2 * count),
    # the same float64 division as Python's (both operands exact integers below 2**53).
    points = (2 * ranks + 1).astype(np.float64) / (2 * totals).astype(np.float64)
    parts = np.minimum(
        np.searchsorted(np.asarray(cumulative, dtype=np.float64), points, side="right"), len(cumulative) - 1
    )
    out = np.empty(n, dtype=np.int64)
    out[order] = parts
    return out
