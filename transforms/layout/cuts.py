"""Exact cuts of a seeded order without gathering a segment on one worker (pure arithmetic).

Shard planning and stratified splits both cut a *segment* of records (a split, or a class)
that is ordered by a seeded hash: the records are sorted by (hash, relpath, path), each has a
weight (estimated bytes for shards, 1 for splits), and a record goes to the part whose
range holds the middle of its weight range: `part_of(2 * before + weight)`, where
`before` is the weight of the records ahead of it in the segment. Sorting a whole segment
on one worker would hold it all (GLDv2's train split: 4.1 M records); this module finds
the same parts from bounded pieces instead:

1. Totals per segment (count, weight), from a combiner: one small entry per segment.
2. Each segment's hash range is cut into 2**bits buckets (the top bits of the hash), with
   `bits` chosen from the totals (`bucket_bits`): about 8 buckets a shard, or up to ~512
   records a bucket for splits. A combiner counts (count, weight) per (segment, bucket)
   for the segments that have more than one bucket: the *bucket table*. For few segments
   (shard planning) the same combiner as the totals counts them at a fixed fine resolution
   (`histogram`), coarsened to `bits` afterwards (`coarsen`): the same table, one pass. Its size follows
   the number of shards (8 entries a shard), or for splits one entry per ~256-512 records
   of the classes above 512 records; it holds small ints only.
3. Prefix sums over the table give each bucket's starting weight. A bucket whose whole
   weight range lies inside one part (`locate`) sends its records to that part directly,
   without knowing their order. Only a bucket that straddles a cut is grouped (one
   bucket: a few hundred records at most) and sorted, to place each record exactly
   (`resolve_bucket`).

The result is the same as sorting the segment whole, on any runner and worker count: the
buckets are ranges of the same hash order, so a bucket's start is the weight of every
record ahead of it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

_HASH_BITS = 64
_MAX_BUCKET_BITS = 40

# SegmentPlan.whole_part / parts_of_buckets: the records' bucket holds a cut (grouped and
# resolved), or the segment has bucket bits (each record's part is its bucket's).
STRADDLES, BUCKETED = -1, -2


def hash64(*parts: str) -> int:
    """A seeded 64-bit hash, the same on every platform and Python (sha256's first 8 bytes)."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


def record_hashes(relpaths: Iterable[str], seed: int) -> bytes:
    """Each relpath's two seeded 64-bit hashes, 16 bytes a record (RecordBatch.hashes).

    One sha256 over (seed, relpath) per record: its first 8 bytes (big-endian) are the split
    hash, the next 8 the shuffle hash. The same on every platform and Python.
    """
    prefix = hashlib.sha256(f"{seed}\0".encode())
    out = []
    for relpath in relpaths:
        h = prefix.copy()
        h.update(relpath.encode("utf-8", "surrogateescape"))
        out.append(h.digest()[:16])
    return b"".join(out)


def seeded_hashes(relpath: str, seed: int) -> tuple[int, int]:
    """(split hash, shuffle hash) of one relpath: the values record_hashes stores."""
    digest = record_hashes((relpath,), seed)
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


def hash_columns(hashes: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(split hashes, shuffle hashes) of RecordBatch.hashes, as uint64 arrays."""
    both = np.frombuffer(hashes, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    return both[:, 0], both[:, 1]


def buckets_of(hashes: np.ndarray, bits: np.ndarray) -> list[int]:
    """bucket_of for arrays: each hash's top `bits` bits (0 where bits is 0)."""
    shift = np.where(bits > 0, _HASH_BITS - bits, 0).astype(np.uint64)
    return np.where(bits > 0, hashes >> shift, 0).tolist()


def bucket_array(hashes: np.ndarray, bits: int) -> np.ndarray:
    """Each hash's top `bits` bits (bits > 0), as a uint64 array."""
    return hashes >> np.uint64(_HASH_BITS - bits)


def bucket_of(hash_value: int, bits: int) -> int:
    """The bucket of a hash: its top `bits` bits (0 when `bits` is 0)."""
    return hash_value >> (_HASH_BITS - bits) if bits else 0


def bits_for(buckets: float) -> int:
    """The bucket bits that give at least `buckets` buckets (0 for one or fewer)."""
    return 0 if buckets <= 1 else min(_MAX_BUCKET_BITS, math.ceil(math.log2(buckets)))


@dataclasses.dataclass(frozen=True)
class Totals:
    """A segment's record count and total weight."""

    count: int
    weight: int


def add_totals(acc: dict, key: object, weight: int, count: int = 1) -> None:
    """Adds `count` records weighing `weight` in all to acc[key] = [count, weight] (a combiner's accumulator)."""
    entry = acc.get(key)
    if entry is None:
        acc[key] = [count, weight]
    else:
        entry[0] += count
        entry[1] += weight


def merge_totals(accs: Iterable[dict]) -> dict:
    """Sums [count, weight] accumulators key by key."""
    it = iter(accs)
    merged = {k: list(v) for k, v in next(it, {}).items()}
    for acc in it:
        for key, (count, weight) in acc.items():
            entry = merged.get(key)
            if entry is None:
                merged[key] = [count, weight]
            else:
                entry[0] += count
                entry[1] += weight
    return merged


@dataclasses.dataclass(frozen=True)
class SegmentPlan(Generic[T]):
    """How one segment is cut: its bucket bits, bucket starts and the part function.

    Attributes:
      bits: bucket bits of the segment.
      part_of: doubled middle of a record's weight range (2 * before + weight) -> part.
      starts: sorted bucket numbers with a recorded weight (empty when bits is 0).
      offsets: weight of all records before each bucket of `starts`, same order.
      weights: weight of each bucket of `starts`.
      total: the segment's total weight (the only bucket's weight when bits is 0).
    """

    bits: int
    part_of: Callable[[int], int]
    starts: tuple[int, ...] = ()
    offsets: tuple[int, ...] = ()
    weights: tuple[int, ...] = ()
    total: int = 0
    _located: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    _arrays: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def bucket_range(self, bucket: int) -> tuple[int, int]:
        """(weight before the bucket, the bucket's weight)."""
        if not self.bits:
            return 0, self.total
        i = bisect.bisect_left(self.starts, bucket)
        if i == len(self.starts) or self.starts[i] != bucket:
            return 0, 0  # not in the table: cannot hold a record
        return self.offsets[i], self.weights[i]

    def locate(self, bucket: int) -> int | None:
        """The part of every record in `bucket`, or None when the bucket straddles a cut."""
        located = self._located
        if bucket in located:
            return located[bucket]
        part = located[bucket] = self._locate(bucket)
        return part

    def whole_part(self) -> int:
        """The part of every record when the segment is one bucket (bits 0): a part, or
        STRADDLES when that bucket holds a cut; BUCKETED when the segment has bucket bits."""
        if self.bits:
            return BUCKETED
        part = self.locate(0)
        return STRADDLES if part is None else part

    def parts_of_buckets(self, buckets: np.ndarray) -> np.ndarray:
        """`locate` for an array of this segment's buckets (uint64): each bucket's part, or
        STRADDLES. The table's parts are computed once a plan; then a binary search a record."""
        if not self._arrays:
            located = [self.locate(b) for b in self.starts]
            self._arrays.append(np.array(self.starts, dtype=np.uint64))
            self._arrays.append(np.array([STRADDLES if p is None else p for p in located], dtype=np.int64))
        starts, parts = self._arrays
        if not len(starts):
            return np.full(len(buckets), STRADDLES, dtype=np.int64)
        at = np.minimum(np.searchsorted(starts, buckets), len(starts) - 1)
        return np.where(starts[at] == buckets, parts[at], STRADDLES)

    def _locate(self, bucket: int) -> int | None:
        start, weight = self.bucket_range(bucket)
        if weight <= 0:
            return None
        # Records weigh at least 1: their doubled middles lie in [2*start+1, 2*(start+weight)-1].
        first, last = self.part_of(2 * start + 1), self.part_of(2 * (start + weight) - 1)
        return first if first == last else None


def segment_plan(
    bits: int, part_of: Callable[[int], int], total: int, table: Mapping[int, tuple[int, int]]
) -> SegmentPlan:
    """A segment's plan from its bucket table ({bucket: (count, weight)}; unused when bits is 0)."""
    if not bits:
        return SegmentPlan(bits, part_of, total=total)
    starts = tuple(sorted(table))
    weights = tuple(table[b][1] for b in starts)
    offsets, running = [], 0
    for w in weights:
        offsets.append(running)
        running += w
    return SegmentPlan(bits, part_of, starts, tuple(offsets), weights, running)


def resolve_bucket(
    items: Iterable[T],
    start: int,
    part_of: Callable[[int], int],
    order: Callable[[T], object],
    weight: Callable[[T], int],
) -> Iterator[tuple[int, T]]:
    """(part, item) for each item of a straddling bucket, in the segment's order.

    Args:
      items: every record of one bucket of one segment (any order).
      start: the weight of the segment's records before this bucket.
      part_of: the segment's part function (see the module docstring).
      order: the sort key of the segment's order.
      weight: a record's weight (>= 1).
    """
    before = start
    for item in sorted(items, key=order):
        w = weight(item)
        yield part_of(2 * before + w), item
        before += w


def shard_part(total: int, target: int | None, num_shards: int | None, count: int) -> Callable[[int], int]:
    """The part function of shard planning (weights are estimated bytes).

    With `target`, shard k holds the records whose middle byte lies in [k*target,
    (k+1)*target): every shard but the last is within one record of the target, the last
    at most one record over. With `num_shards` (at most one shard per record), the total
    is cut into that many equal ranges.
    """
    if num_shards:
        n = min(num_shards, count)
        return lambda doubled: min(n - 1, doubled * n // (2 * total)) if total else 0
    if not target or target <= 0:
        raise ValueError("shard planning needs target_bytes or num_shards")
    return lambda doubled: doubled // (2 * target)


def shard_count(total: int, target: int | None, num_shards: int | None, count: int) -> int:
    """Shards a segment gets (an upper bound with `target`: a record bigger than the target can skip one)."""
    if num_shards:
        return min(num_shards, count)
    return max(1, -(-total // target)) if target else 1


def split_part(count: int, cumulative: tuple[float, ...]) -> Callable[[int], int]:
    """The part function of a stratified split (weights are 1; parts are split indexes).

    Record i of n (0-based, in the seeded order) has its middle at (i + 0.5) / n and goes
    to the first split whose cumulative ratio exceeds that point: each class is cut at the
    ratios as closely as whole records allow.
    """
    last = len(cumulative) - 1

    def part(doubled: int) -> int:
        point = doubled / (2 * count)
        for j, c in enumerate(cumulative):
            if point < c:
                return j
        return last

    return part


# A bucket histogram: (sorted distinct buckets uint64, count int64, weight int64) arrays.
Histogram = tuple[np.ndarray, np.ndarray, np.ndarray]


def histogram(buckets: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> Histogram:
    """Sums (count, weight) per distinct bucket, exactly (integer sums), buckets sorted."""
    if not len(buckets):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(buckets, kind="stable")
    buckets = buckets[order]
    starts = np.flatnonzero(np.concatenate(([True], buckets[1:] != buckets[:-1])))
    return (
        buckets[starts],
        np.add.reduceat(counts[order], starts),
        np.add.reduceat(weights[order], starts),
    )


def merge_histograms(parts: Iterable[Histogram]) -> Histogram:
    """One histogram of several (the sums of equal buckets)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    return histogram(*(np.concatenate([p[i] for p in parts]) for i in range(3)))


def coarsen(hist: Histogram, fine_bits: int, bits: int) -> dict[int, tuple[int, int]]:
    """A histogram of `fine_bits` buckets as a bucket table of `bits` (<= fine_bits) buckets:
    {bucket: (count, weight)} (the same table a count at `bits` would give)."""
    buckets, counts, weights = histogram(hist[0] >> np.uint64(fine_bits - bits), hist[1], hist[2])
    return dict(zip(buckets.tolist(), zip(counts.tolist(), weights.tolist())))
