"""Splits and shard plans as plain arithmetic on record metadata (pure).

In: ImageRecords (path, label, size). Out: each record's split (a seeded hash, or per class
for --stratify), the seeded shuffle order, and the whole-split reference plan the tests
compare the bounded Beam plan (beam.py, cuts.py) against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from transforms.layout import cuts
from transforms.records import ImageRecord, RecordBatch

DEFAULT_SEED = 42


DEFAULT_SHARD_SIZE_MB = 128
# Records a shard holds at most with --shard_size_mb (as WebDataset's ShardWriter caps
# `maxcount`): a 128 MB shard of 600-byte images would otherwise hold ~150,000 records, all
# in one group and one writer's hands. Images above ~13 KB never meet it at 128 MB.
DEFAULT_MAX_RECORDS_PER_SHARD = 10_000


# Bytes a record adds to the file's own size besides its path and labels: feature keys,
# the other values and the TFRecord framing (measured for the slim keys: 247).
_RECORD_OVERHEAD = 250


# Hash buckets per planned shard: a straddling bucket (grouped whole to place its records)
# holds about 1/8 of a shard's records, and the bucket table 8 small entries a shard.
_BUCKETS_PER_SHARD = 8


# Bucket bits of the one-pass bucket counts of shard planning (CutOrder with fine_bits):
# 65,536 buckets a split, coarsened to ~8 a shard. Up to 8,192 shards a split (~9 M images of
# ~120 KB at 128 MB a shard) that is the same table as a count at the bits the totals give;
# past that a bucket holds 1/65,536 of the split (the straddling group grows past 1/8 shard).
_FINE_BITS = 16


# Records per hash bucket of a class above this size (stratified splits): the largest
# straddling group is about this, the bucket table one entry per 256-512 records of such classes.
_SPLIT_BUCKET = 512


def _shuffle_hash(record: ImageRecord, seed: int) -> int:
    return cuts.seeded_hashes(record.relpath, seed)[1]


def _split_hash(record: ImageRecord, seed: int) -> int:
    return cuts.seeded_hashes(record.relpath, seed)[0]


def with_hashes(batch: RecordBatch, seed: int) -> RecordBatch:
    """`batch` with its records' seeded hashes (cuts.record_hashes), computed unless it has them."""
    if batch.hashes is not None and batch.hash_seed == seed:
        return batch
    return batch.with_columns(hashes=cuts.record_hashes(batch.relpaths, seed), hash_seed=seed)


def shuffle_key(record: ImageRecord, seed: int) -> tuple[int, str, str]:
    """Sort key of the global shuffle: a seeded hash, ties broken by relpath, then by path
    (two archives may hold the same member path)."""
    return _shuffle_hash(record, seed), record.relpath, record.path


def parse_split_ratios(spec: str) -> tuple[tuple[str, float], ...]:
    """Parses 'train=0.8,validation=0.1,test=0.1'.

    Raises:
      ValueError: malformed, a negative ratio, repeated names, or ratios not summing to 1.
    """
    ratios: list[tuple[str, float]] = []
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--splits: expected name=ratio, got {part!r}")
        try:
            ratio = float(value)
        except ValueError:
            raise ValueError(f"--splits: {value!r} is not a number") from None
        if ratio < 0:
            raise ValueError(f"--splits: negative ratio for {name!r}")
        ratios.append((name, ratio))
    names = [n for n, _ in ratios]
    if len(set(names)) != len(names):
        raise ValueError("--splits: a split is named twice")
    total = sum(r for _, r in ratios)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--splits: ratios sum to {total:g}, not 1")
    return tuple(ratios)


def split_for_key(key: str, seed: int, ratios: Sequence[tuple[str, float]]) -> str:
    """The split of an image, from a seeded hash of its key alone.

    Adding or removing other images never moves this one to another split.
    """
    return ratios[split_indexes(np.array([cuts.seeded_hashes(key, seed)[0]], np.uint64), ratios)[0]][0]


def split_indexes(split_hashes: np.ndarray, ratios: Sequence[tuple[str, float]]) -> list[int]:
    """The split (an index into `ratios`) of each split hash: the first split whose
    cumulative ratio exceeds hash / 2**64 (the last split past them all)."""
    points = split_hashes.astype(np.float64) / 2.0**64  # exact: a power of two
    index = np.searchsorted(np.array(_cumulative(ratios)), points, side="right")
    return np.minimum(index, len(ratios) - 1).tolist()


def _cumulative(ratios: Sequence[tuple[str, float]]) -> tuple[float, ...]:
    out, running = [], 0.0
    for _, ratio in ratios:
        running += ratio
        out.append(running)
    return tuple(out)


def stratified_splits(
    records: Iterable[ImageRecord], seed: int, ratios: Sequence[tuple[str, float]]
) -> list[tuple[str, ImageRecord]]:
    """Splits one class's records so that each split gets its ratio of the class.

    Records are ordered by the same seeded hash as `split_for_key` and cut at the
    cumulative ratios, so every class is represented in each split as closely as whole
    images allow. Unlike the plain hash, adding images can move a few existing ones.
    This sorts the class whole: the reference that AssignSplits(stratify=True) matches
    without gathering a class (tested).
    """
    ordered = list(records)
    part = cuts.split_part(len(ordered), _cumulative(ratios))
    placed = cuts.resolve_bucket(
        ordered, 0, part, lambda r: (_split_hash(r, seed), r.relpath, r.path), lambda r: 1
    )
    return [(ratios[index][0], record) for index, record in placed]


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


def record_size(record: ImageRecord) -> int:
    """Estimated bytes of the record in a TFRecord file."""
    text = _utf8_len(record.relpath) + sum(map(_utf8_len, record.labels))
    return record.size + text + _RECORD_OVERHEAD


def record_sizes(batch: RecordBatch) -> list[int]:
    """record_size of each record of `batch`, from its columns (numpy sums: the text lengths
    counted once per distinct label tuple, and per record only when a path is not ASCII)."""
    n = len(batch)
    relpaths = batch.relpaths
    if "".join(relpaths).isascii():
        text = np.fromiter(map(len, relpaths), np.int64, n)
    else:
        text = np.fromiter(map(_utf8_len, relpaths), np.int64, n)
    label_len: dict[tuple[str, ...], int] = {}
    for labels in set(batch.labels):
        label_len[labels] = sum(map(_utf8_len, labels))
    text += np.fromiter(map(label_len.__getitem__, batch.labels), np.int64, n)
    return (np.fromiter(batch.sizes, np.int64, n) + text + _RECORD_OVERHEAD).tolist()


def weight_floor(target_bytes: int | None, max_records: int | None) -> int:
    """The least planning weight of a record, so that no shard of `target_bytes` holds more
    than `max_records` records (0: no floor; only with a target and a cap).

    A shard holds the records whose middle byte lies in a range of `target_bytes`; with every
    record weighing at least target // max_records + 1, their middles lie that far apart, so
    fewer than target / floor < max_records + 1 of them fit. Only records smaller than the
    floor (tiny images: ~13 KB at the defaults) weigh more than their estimated bytes.
    """
    if not target_bytes or not max_records:
        return 0
    return target_bytes // max_records + 1


def planning_weights(floor: int) -> Callable[[RecordBatch], list[int]]:
    """record_sizes of a batch, each raised to `floor` (weight_floor)."""
    if not floor:
        return record_sizes

    def weights(batch: RecordBatch) -> list[int]:
        return np.maximum(np.asarray(record_sizes(batch), dtype=np.int64), floor).tolist()

    return weights


def plan_shards(
    records: Iterable[ImageRecord],
    seed: int,
    target_bytes: int | None = None,
    num_shards: int | None = None,
    max_records: int | None = None,
) -> list[list[ImageRecord]]:
    """Shuffles one split's records and cuts them into shards (the whole split sorted at once).

    Shard k holds the records whose middle byte (in shuffled order) falls in its range:
    with `target_bytes` the range [k * target, (k + 1) * target), so every shard but the
    last is within one record of the target and the last at most one record over it;
    with `num_shards`, `num_shards` equal ranges of the total. With `target_bytes` and
    `max_records`, a record weighs at least weight_floor (so a shard of tiny images holds
    at most `max_records` of them). Empty shards are dropped. This is the reference that
    PlanShards matches without gathering a split (tested).
    """
    ordered = list(records)
    if not ordered:
        return []
    if not num_shards and (not target_bytes or target_bytes <= 0):
        raise ValueError("plan_shards needs target_bytes or num_shards")
    floor = 0 if num_shards else weight_floor(target_bytes, max_records)

    def weight(record: ImageRecord) -> int:
        return max(record_size(record), floor)

    total = sum(map(weight, ordered))
    part = cuts.shard_part(total, target_bytes, num_shards, len(ordered))
    shards: dict[int, list[ImageRecord]] = {}
    for index, record in cuts.resolve_bucket(ordered, 0, part, lambda r: shuffle_key(r, seed), weight):
        shards.setdefault(index, []).append(record)
    return [shards[i] for i in sorted(shards)]


def _split_layout(
    cumulative: tuple[float, ...],
) -> Callable[[str, int, int], tuple[int, Callable[[int], int]]]:
    def layout(_segment: str, count: int, _weight: int) -> tuple[int, Callable[[int], int]]:
        return cuts.bits_for(count / _SPLIT_BUCKET), cuts.split_part(count, cumulative)

    return layout


def _shard_layout(
    target: int | None, num: int | None
) -> Callable[[str, int, int], tuple[int, Callable[[int], int]]]:
    def layout(_segment: str, count: int, weight: int) -> tuple[int, Callable[[int], int]]:
        shards = cuts.shard_count(weight, target, num, count)
        return cuts.bits_for(shards * _BUCKETS_PER_SHARD), cuts.shard_part(weight, target, num, count)

    return layout


def _class_of(record: ImageRecord) -> str:
    return record.class_key


def _split_of(record: ImageRecord) -> str:
    return record.split


def _one(_record: ImageRecord) -> int:
    return 1
