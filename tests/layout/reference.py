"""Whole-split (and whole-class) reference plans: what the bounded Beam plan must equal.

Each sorts a whole split or class at once, which the product never does (it would gather
them on one worker); the tests compare PlanShards and AssignSplits against these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from transforms.layout.plan import (
    DEFAULT_SEED,
    FINE_BITS,
    cumulative,
    record_hashes,
    record_sizes,
    weight_floor,
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
    """One split sorted whole in the shuffle order and cut by its weight: a record's place is
    the weight of the hash buckets (the top FINE_BITS bits) before its own plus its hash's
    fraction of its bucket's weight; shard k holds the places in [k x shard, (k + 1) x shard),
    the last shard the rest. Empty shards are dropped."""
    floor = 0 if num_shards else weight_floor(target_bytes, max_records)
    ordered = sorted(records, key=lambda r: (seeded_hashes(r.relpath, seed)[1], r.relpath, r.path))
    if not ordered:
        return []
    low = 64 - FINE_BITS
    hashes = [seeded_hashes(r.relpath, seed)[1] for r in ordered]
    bucket_weight: dict[int, int] = {}
    for h, r in zip(hashes, ordered):
        bucket_weight[h >> low] = bucket_weight.get(h >> low, 0) + max(record_size(r), floor)
    before, running = {}, 0
    for b in sorted(bucket_weight):
        before[b], running = running, running + bucket_weight[b]
    if num_shards:
        shard, last = running / min(num_shards, len(ordered)), min(num_shards, len(ordered)) - 1
    else:
        shard, last = float(target_bytes), max(1, math.ceil(running / target_bytes)) - 1
    shards: dict[int, list[ImageRecord]] = {}
    for h, r in zip(hashes, ordered):
        b = h >> low
        place = before[b] + (h & ((1 << low) - 1)) * 2.0**-low * bucket_weight[b]
        shards.setdefault(min(int(place / shard), last), []).append(r)
    return [shards[k] for k in sorted(shards)]
