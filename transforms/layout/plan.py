"""Splits and the shard plan as plain arithmetic on record metadata (pure).

In: RecordBatches of ImageRecords (path, label, size). Out: each record's seeded hashes, its
split, its estimated bytes, and its shard: a range of the seeded shuffle hash sized from its
split's totals (as TensorFlow Datasets' `shuffle.get_bucket_number`).
"""

from __future__ import annotations

import collections
import difflib
import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from transforms.records import RecordBatch

DEFAULT_SEED = 42
DEFAULT_SHARD_SIZE_MB = 128
# Records a shard holds (about) at most with --shard_size_mb (as WebDataset's `maxcount`): a
# 128 MB shard of 600-byte images would otherwise be ~150,000 records in one group.
DEFAULT_MAX_RECORDS_PER_SHARD = 10_000

# Bytes a record adds besides its file, path and labels: feature keys, other values, framing.
_RECORD_OVERHEAD = 250

# The columns of RecordBatch.hashes (hash_columns): the split hash and the shuffle hash.
SPLIT_HASH, SHUFFLE_HASH = 0, 1


def hash64(*parts: str) -> int:
    """A seeded 64-bit hash, the same on every platform and Python (sha256's first 8 bytes)."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


def record_hashes(relpaths: Iterable[str], seed: int) -> bytes:
    """Each relpath's two seeded 64-bit hashes, 16 bytes a record (RecordBatch.hashes): the
    first 16 bytes of sha256(seed, NUL, relpath), the split hash then the shuffle hash."""
    prefix = hashlib.sha256(f"{seed}\0".encode())
    out = []
    for relpath in relpaths:
        h = prefix.copy()
        h.update(relpath.encode("utf-8", "surrogateescape"))
        out.append(h.digest()[:16])
    return b"".join(out)


def hash_columns(hashes: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(split hashes, shuffle hashes) of RecordBatch.hashes, as uint64 arrays."""
    both = np.frombuffer(hashes, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    return both[:, SPLIT_HASH], both[:, SHUFFLE_HASH]


def with_hashes(batch: RecordBatch, seed: int) -> RecordBatch:
    """`batch` with its records' seeded hashes (record_hashes), computed unless it has them."""
    if batch.hashes is not None and batch.hash_seed == seed:
        return batch
    return batch.with_columns(hashes=record_hashes(batch.relpaths, seed), hash_seed=seed)


def shuffle_order(batch: RecordBatch) -> list[int]:
    """The indexes of a hashed batch's records in the seeded shuffle order: the shuffle hash,
    ties broken by relpath, then by path (two archives may hold the same member path)."""
    keys = list(zip(hash_columns(batch.hashes)[SHUFFLE_HASH].tolist(), batch.relpaths, batch.paths))
    return sorted(range(len(keys)), key=keys.__getitem__)


# The split names readers expect (TFDS, Keras): a name within SPLIT_TYPO_DISTANCE edits of one
# of them, but not it, is most likely a typo (`valdiation`) and gets a warning.
USUAL_SPLITS = ("train", "validation", "test")
SPLIT_TYPO_DISTANCE = 2
FOLDERS = "folders"  # --splits folders: the split is the first folder level


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions) between two short strings."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ca != cb))
    return row[-1]


def split_name_warnings(names: Iterable[str]) -> list[str]:
    """A warning for each split name that is within SPLIT_TYPO_DISTANCE edits of a usual one
    (USUAL_SPLITS) without being it: 'split 'valdiation': did you mean 'validation'?'."""
    warnings = []
    for name in names:
        if name in USUAL_SPLITS:
            continue
        distance, usual = min((edit_distance(name.lower(), u), u) for u in USUAL_SPLITS)
        if distance <= SPLIT_TYPO_DISTANCE:
            usual_names = ", ".join(USUAL_SPLITS)
            warnings.append(f"split {name!r} is not one of {usual_names}: did you mean {usual!r}?")
    return warnings


def parse_split_ratios(spec: str) -> tuple[tuple[str, float], ...]:
    """Parses 'train=0.8,validation=0.1,test=0.1'.

    Raises:
      ValueError: malformed, a negative ratio, repeated names, or ratios not summing to 1
        (with the likely fix: `folders` for `folder`, fractions for percentages).
    """
    ratios: list[tuple[str, float]] = []
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            hint = ""
            if "," not in spec and "=" not in spec and difflib.get_close_matches(spec.strip(), [FOLDERS]):
                hint = f": did you mean --splits {FOLDERS}?"
            raise ValueError(f"--splits: expected name=ratio,... or {FOLDERS}, got {part!r}{hint}")
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
    if abs(total - 100.0) < 1e-6:
        fractions = ",".join(f"{name}={ratio / 100:g}" for name, ratio in ratios)
        raise ValueError(f"--splits: ratios sum to 100, not 1: did you mean --splits {fractions}?")
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--splits: ratios sum to {total:g}, not 1")
    return tuple(ratios)


def cumulative(ratios: Sequence[tuple[str, float]]) -> tuple[float, ...]:
    """The running sums of the split ratios."""
    return tuple(np.cumsum([ratio for _, ratio in ratios]).tolist())


def split_indexes(split_hashes: np.ndarray, ratios: Sequence[tuple[str, float]]) -> list[int]:
    """The split (an index into `ratios`) of each split hash: the first whose cumulative ratio
    exceeds hash / 2**64. A record's split depends on its own hash: adding images moves no other."""
    points = split_hashes.astype(np.float64) / 2.0**64  # exact: a power of two
    index = np.searchsorted(np.array(cumulative(ratios)), points, side="right")
    return np.minimum(index, len(ratios) - 1).tolist()


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


def record_sizes(batch: RecordBatch) -> np.ndarray:
    """Each record's estimated bytes in a TFRecord file (file size + relpath + labels + the
    Example's overhead), from the batch's columns (label lengths once per distinct tuple)."""
    n = len(batch)
    relpaths = batch.relpaths
    if "".join(relpaths).isascii():
        text = np.fromiter(map(len, relpaths), np.int64, n)
    else:
        text = np.fromiter(map(_utf8_len, relpaths), np.int64, n)
    label_len = {labels: sum(map(_utf8_len, labels)) for labels in set(batch.labels)}
    text += np.fromiter(map(label_len.__getitem__, batch.labels), np.int64, n)
    return np.fromiter(batch.sizes, np.int64, n) + text + _RECORD_OVERHEAD


def weight_floor(target_bytes: int | None, max_records: int | None) -> int:
    """The least planning weight of a record, so that a shard of `target_bytes` holds about
    `max_records` records at most (0: no floor)."""
    if not target_bytes or not max_records:
        return 0
    return target_bytes // max_records + 1


# Bits of the hash buckets of a split's weight histogram: 65,536 buckets (512 KB) a split.
FINE_BITS = 16
_FINE = np.uint64(64 - FINE_BITS)  # a hash >> _FINE: its bucket
_WITHIN = np.uint64((1 << (64 - FINE_BITS)) - 1)  # a hash & _WITHIN: its place in its bucket

# A split's totals are two keys of the summed side input: (split, RECORDS), its record count,
# and (split, WEIGHTS), its planning weight per hash bucket (an int64 array of 2**FINE_BITS).
RECORDS, WEIGHTS = "records", "weights"


def split_weights(batch: RecordBatch, floor: int) -> list[tuple[tuple[str, str], object]]:
    """((split, RECORDS), records) and ((split, WEIGHTS), weight per hash bucket) per split of a
    hashed `batch` (record_sizes raised to `floor`), summed into the totals by SumPerKeyFn."""
    buckets = (hash_columns(batch.hashes)[SHUFFLE_HASH] >> _FINE).astype(np.int64)
    weights = np.maximum(record_sizes(batch), floor)
    counts = collections.Counter(batch.splits)
    out: list[tuple[tuple[str, str], object]] = []
    for split, n in counts.items():
        mine = slice(None) if n == len(buckets) else np.array(batch.splits) == split
        hist = np.bincount(buckets[mine], weights=weights[mine], minlength=1 << FINE_BITS)
        out += [((split, RECORDS), n), ((split, WEIGHTS), hist.astype(np.int64))]
    return out


def shard_scale(
    records: int, weights: np.ndarray, target_bytes: int | None, num_shards: int | None
) -> tuple[np.ndarray, float, int]:
    """(cumulative weight before each hash bucket and the total, weight of a shard, last shard)
    of a split: `num_shards` (at most one a record) equal parts of its weight, or `target_bytes`."""
    cum = np.concatenate(([0], np.cumsum(weights)))
    if num_shards:
        n = min(num_shards, records)
        return cum, int(cum[-1]) / n, n - 1
    if not target_bytes or target_bytes <= 0:
        raise ValueError("shard planning needs target_bytes or num_shards")
    return cum, float(target_bytes), max(1, -(-int(cum[-1]) // target_bytes)) - 1


def shard_indexes(shuffle_hashes: np.ndarray, cum: np.ndarray, shard: float, last: int) -> np.ndarray:
    """Each record's shard: a range of the split's weight in shuffle-hash order. A record's
    place is the weight of the hash buckets before its own plus its hash's fraction of its
    bucket's weight; shard k holds the places in [k x shard, (k + 1) x shard), the last the rest.

    A shard is off its target by at most part of a bucket's weight at each end (1/65,536 of the
    split); an equal hash range alone (TFDS) would hold a random sum, ~3% (sd) at 1,000 records
    a shard (`benchmarks/scale.py --spread`). Float64 arithmetic: the same on every platform.
    """
    buckets = (shuffle_hashes >> _FINE).astype(np.int64)
    within = (shuffle_hashes & _WITHIN).astype(np.float64) * 2.0 ** -(64 - FINE_BITS)  # exact
    before = cum[buckets]
    place = before + within * (cum[buckets + 1] - before)
    return np.minimum((place / shard).astype(np.int64), last)
