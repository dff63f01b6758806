"""Whole-split (and whole-class) reference plans: what the bounded Beam plan must equal.

Each sorts a whole split or class at once, which the product never does (it would gather
them on one worker); the tests compare PlanShards and AssignSplits against these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from transforms.layout.plan import (
    DEFAULT_SEED,
    cumulative,
    record_hashes,
    record_sizes,
    shard_units,
)
from transforms.records import ImageRecord, RecordBatch


def seeded_hashes(relpath: str, seed: int) -> tuple[int, int]:
    """(split hash, shuffle hash) of one relpath, as Python ints."""
    digest = record_hashes((relpath,), seed)
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


def record_size(record: ImageRecord) -> int:
    return int(record_sizes(RecordBatch((record,)))[0])


def split_for_key(key: str, seed: int, ratios: Sequence[tuple[str, float]]) -> str:
    """The split of an image: the first whose cumulative ratio exceeds its split hash / 2**64."""
    point = seeded_hashes(key, seed)[0] / 2.0**64
    return next((name for (name, _), c in zip(ratios, cumulative(ratios)) if point < c), ratios[-1][0])


def stratified_splits(
    records: Iterable[ImageRecord], seed: int, ratios: Sequence[tuple[str, float]]
) -> list[tuple[str, ImageRecord]]:
    """One class sorted whole by (split hash, relpath, path): record i of n goes to the first
    split whose cumulative ratio exceeds (i + 0.5) / n."""
    ordered = sorted(records, key=lambda r: (seeded_hashes(r.relpath, seed)[0], r.relpath, r.path))
    n, bounds = len(ordered), cumulative(ratios)
    out = []
    for i, record in enumerate(ordered):
        point = (2 * i + 1) / (2 * n)
        out.append((next((ratios[j][0] for j, c in enumerate(bounds) if point < c), ratios[-1][0]), record))
    return out


def plan_shards(
    records: Iterable[ImageRecord],
    seed: int = DEFAULT_SEED,
    target_bytes: int | None = None,
    num_shards: int | None = None,
    max_records: int | None = None,
) -> list[list[ImageRecord]]:
    """One split sorted whole in the shuffle order and cut into its hash ranges: shard k holds
    the records whose shuffle hash h has floor(h / 2**64 * units) == k (the last: k and above).
    Empty shards are dropped."""
    ordered = sorted(records, key=lambda r: (seeded_hashes(r.relpath, seed)[1], r.relpath, r.path))
    if not ordered:
        return []
    size = sum(map(record_size, ordered))
    units = shard_units(len(ordered), size, target_bytes, num_shards, max_records)
    last = max(1, math.ceil(units)) - 1
    shards: dict[int, list[ImageRecord]] = {}
    for r in ordered:
        k = min(int((seeded_hashes(r.relpath, seed)[1] >> 11) * 2.0**-53 * units), last)
        shards.setdefault(k, []).append(r)
    return [shards[k] for k in sorted(shards)]
