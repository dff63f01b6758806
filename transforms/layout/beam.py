"""Dataset layout: split assignment, a deterministic global shuffle and shard planning.

RecordBatches of ImageRecord metadata in (transforms/records.py); RecordBatches with each
record's split set (AssignSplits) and ShardTasks, one shard's records in write order
(PlanShards), out. No image bytes are read here.

The shuffle is a sort by a seeded hash of each image's relative path, so the same input
and seed give the same shards on any runner and with any number of workers, and classes
are mixed inside every shard. Neither a split nor a class is ever gathered on one worker:
the cuts (shard boundaries, a class's split boundaries) are found from totals and per-bucket
counts of that hash order (transforms/layout/cuts.py), and the only groups are one shard's
records, or one hash bucket that straddles a cut. Every group's size goes to a Beam
distribution metric (batching.group_size).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam import coders as beam_coders
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms import coders
from transforms.batching import BatchGather, group_size
from transforms.coders import SideDict, record_batch_fields
from transforms.layout import cuts
from transforms.layout.plan import (
    _STRADDLING,
    DEFAULT_SEED,
    _cumulative,
    _shard_layout,
    _split_layout,
    record_sizes,
    split_indexes,
    with_hashes,
)
from transforms.records import BATCH_SIZE, RecordBatch, ShardTask

# The hash columns of RecordBatch.hashes (cuts.hash_columns).
_SPLIT_HASH, _SHUFFLE_HASH = 0, 1


def _class_keys(batch: RecordBatch) -> Sequence[str]:
    return batch.class_keys()


def _splits(batch: RecordBatch) -> Sequence[str]:
    return batch.splits


@dataclasses.dataclass(frozen=True)
class _Order:
    """What CutOrder cuts, read from a RecordBatch's columns: each record's segment, its
    place in the seeded order (one of the batch's stored hashes), its weight, and each
    segment's bucket bits and part function from its totals."""

    seed: int
    segments: Callable[[RecordBatch], Sequence[str]]
    hash_column: int  # _SPLIT_HASH or _SHUFFLE_HASH
    weights: Callable[[RecordBatch], Sequence[int]] | None  # None: every record weighs 1
    # (segment, count, weight) -> (bucket bits, part function), from the totals alone
    layout: Callable[[str, int, int], tuple[int, Callable[[int], int]]]

    def hashes(self, batch: RecordBatch) -> np.ndarray:
        return cuts.hash_columns(with_hashes(batch, self.seed).hashes)[self.hash_column]

    def weights_of(self, batch: RecordBatch) -> Sequence[int]:
        return self.weights(batch) if self.weights is not None else [1] * len(batch)

    def sort_keys(self, batch: RecordBatch) -> list[tuple[int, str, str]]:
        """Each record's place in the seeded order: its hash, ties broken by relpath, then path."""
        return list(zip(self.hashes(batch).tolist(), batch.relpaths, batch.paths))


class SegmentTotalsFn(beam.CombineFn):
    """RecordBatches -> {segment: [count, weight]}: one small entry per split or class."""

    def __init__(self, order: _Order):
        self._order = order

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, batch: RecordBatch) -> dict:
        segments = self._order.segments(batch)
        if self._order.weights is None:
            for segment, n in collections.Counter(segments).items():
                cuts.add_totals(acc, segment, n, count=n)
        else:
            for segment, weight in zip(segments, self._order.weights(batch)):
                cuts.add_totals(acc, segment, weight)
        return acc

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        return cuts.merge_totals(accs)

    def extract_output(self, acc: dict) -> SideDict:
        return SideDict(acc)


class _Plans:
    """Each segment's SegmentPlan, built on first use from the totals and bucket table.

    A segment's layout depends on its totals alone, so segments of one bucket (most classes)
    with the same totals share one plan: 200,000 small classes make a few hundred plans.
    """

    def __init__(self, order: _Order, totals: dict, table: dict):
        self._order, self._totals, self._table = order, totals, table
        self._plans: dict[str, cuts.SegmentPlan] = {}
        self._one_bucket: dict[tuple[int, int], cuts.SegmentPlan] = {}

    def get(self, segment: str) -> cuts.SegmentPlan:
        plan = self._plans.get(segment)
        if plan is None:
            count, weight = self._totals[segment]
            plan = self._one_bucket.get((count, weight))
            if plan is None:
                bits, part = self._order.layout(segment, count, weight)
                plan = cuts.segment_plan(bits, part, weight, self._table.get(segment, {}))
                if not bits:
                    self._one_bucket[count, weight] = plan
            self._plans[segment] = plan
        return plan


def _layout_bits(order: _Order, totals: dict) -> dict[str, int]:
    return {seg: order.layout(seg, count, weight)[0] for seg, (count, weight) in totals.items()}


class CountBucketsFn(beam.DoFn):
    """RecordBatches -> one partial bucket table per bundle (see MergeBucketTablesFn).

    Only segments with bucket bits (from the totals side input) are counted.
    """

    def __init__(self, order: _Order):
        self._order = order

    def start_bundle(self) -> None:
        self._table: dict = {}
        self._bits: dict[str, int] | None = None
        self._totals: dict | None = None

    def process(self, batch: RecordBatch, totals: dict) -> None:
        if self._bits is None or self._totals is not totals:
            self._bits, self._totals = _layout_bits(self._order, totals), totals
        order, table, get = self._order, self._table, self._bits.get
        segments = order.segments(batch)
        bits = np.fromiter((get(s, 0) for s in segments), np.int64, len(segments))
        if not bits.any():
            return
        buckets = cuts.buckets_of(order.hashes(batch), bits)
        for seg, b, bucket, weight in zip(segments, bits.tolist(), buckets, order.weights_of(batch)):
            if b:
                cuts.add_totals(table.setdefault(seg, {}), bucket, weight)

    def finish_bundle(self) -> Iterator:
        if self._table:
            yield GlobalWindows.windowed_value(self._table)


class MergeBucketTablesFn(beam.CombineFn):
    """Partial tables -> {segment: {bucket: [count, weight]}} for the segments with bucket bits.

    Bounded by the bucket count: 8 entries a shard (planning), or one per 256-512 records
    of the classes above 512 records (stratified splits); small ints only.
    """

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, table: dict) -> dict:
        return self.merge_accumulators([acc, table])

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        merged: dict = {}
        for acc in accs:
            for seg, buckets in acc.items():
                mine = merged.get(seg)
                merged[seg] = buckets if mine is None else cuts.merge_totals([mine, buckets])
        return merged

    def extract_output(self, acc: dict) -> SideDict:
        return SideDict(acc)


class Located:
    """CutOrder's output: a RecordBatch and each of its records' part (one element per
    input batch, or per straddling bucket). Coded as its columns (LocatedCoder)."""

    __slots__ = ("parts", "batch")

    def __init__(self, parts: tuple[int, ...], batch: RecordBatch):
        self.parts, self.batch = parts, batch

    def __iter__(self) -> Iterator:
        return iter((self.parts, self.batch))

    def __reduce__(self) -> tuple:
        return Located, (self.parts, self.batch)


def _encode_located(located: Located) -> bytes:
    return coders.tagged((located.parts, *record_batch_fields(located.batch)), located)


def _decode_located(data: bytes) -> Located:
    return coders.untagged(data, lambda t: Located(t[0], RecordBatch.from_columns(*t[1:])))


class LocatedCoder(coders.TupleCoder):
    _type, _encode, _decode = Located, _encode_located, _decode_located


beam_coders.registry.register_coder(Located, LocatedCoder)

_KeyedBatch = tuple[tuple[str, int], RecordBatch]


class KeyPartsFn(beam.DoFn):
    """RecordBatch -> (parts, RecordBatch) of its records whose bucket lies in one part (one
    element per input batch, no record moved); ((segment, bucket), RecordBatch) on the
    STRADDLING output for the others, gathered per key over the bundle (batching.BatchGather:
    at most 50,000 records held).
    """

    def __init__(self, order: _Order):
        self._order = order

    def start_bundle(self) -> None:
        self._straddling = BatchGather()
        self._plans: _Plans | None = None
        self._sides: tuple = ()

    def process(self, batch: RecordBatch, totals: dict, table: dict) -> Iterator:
        if self._plans is None or self._sides[0] is not totals or self._sides[1] is not table:
            self._plans, self._sides = _Plans(self._order, totals, table), (totals, table)
        get = self._plans.get
        segments = self._order.segments(batch)
        plans = [get(s) for s in segments]
        bits = np.fromiter((p.bits for p in plans), np.int64, len(plans))
        buckets = cuts.buckets_of(self._order.hashes(batch), bits) if bits.any() else [0] * len(plans)
        direct: list[int] = []
        parts: list[int] = []
        straddling: dict[tuple[str, int], list[int]] = {}
        for i, (plan, bucket) in enumerate(zip(plans, buckets)):
            part = plan.locate(bucket)
            if part is None:
                straddling.setdefault((segments[i], bucket), []).append(i)
            else:
                direct.append(i)
                parts.append(part)
        if direct:
            yield Located(tuple(parts), batch if len(direct) == len(batch) else batch.take(direct))
        for key, indices in straddling.items():
            for item in self._straddling.add(key, batch.take(indices)):
                yield pvalue.TaggedOutput(_STRADDLING, item)

    def finish_bundle(self) -> Iterator:
        for item in self._straddling.drain():
            yield pvalue.TaggedOutput(_STRADDLING, GlobalWindows.windowed_value(item))


class ResolveCutsFn(beam.DoFn):
    """((segment, bucket), [RecordBatch]) -> (parts, RecordBatch): one straddling bucket
    sorted, each record placed by its exact weight offset. The group is one bucket."""

    def __init__(self, order: _Order, step: str):
        self._order = order
        self._sizes = group_size(step)

    def start_bundle(self) -> None:
        self._plans: _Plans | None = None
        self._sides: tuple = ()

    def process(
        self, element: tuple[tuple[str, int], Iterable[RecordBatch]], totals: dict, table: dict
    ) -> Iterator[Located]:
        if self._plans is None or self._sides[0] is not totals or self._sides[1] is not table:
            self._plans, self._sides = _Plans(self._order, totals, table), (totals, table)
        (seg, bucket), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        plan = self._plans.get(seg)
        start, _ = plan.bucket_range(bucket)
        keys, weights = self._order.sort_keys(batch), self._order.weights_of(batch)
        placed = list(
            cuts.resolve_bucket(range(len(batch)), start, plan.part_of, keys.__getitem__, weights.__getitem__)
        )
        yield Located(tuple(part for part, _ in placed), batch.take([i for _, i in placed]))


def _same(element: object) -> object:
    return element


class CutOrder(beam.PTransform):
    """RecordBatches -> (parts, RecordBatch): every record with its exact part.

    Two lifted combiners give the totals per segment (one entry per split or class) and the
    bucket table (see MergeBucketTablesFn); both are side inputs of a few small ints per
    segment or bucket, materialized once. Records of a bucket inside one part get it at once
    (no move); a straddling bucket is grouped (one bucket's records: the only group here)
    and resolved. The records must carry their seeded hashes (plan.with_hashes).
    """

    def __init__(self, order: _Order, name: str):
        """name: the transform's full label, e.g. 'PlanShards/CutSplits', for the group metric."""
        super().__init__()
        self._order, self._name = order, name

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[Located]:
        order = self._order
        totals = pvalue.AsSingleton(
            records
            | "Totals"
            >> beam.CombineGlobally(SegmentTotalsFn(order)).without_defaults().with_output_types(SideDict),
            default_value={},
        )
        table = pvalue.AsSingleton(
            records
            | "CountBuckets" >> beam.ParDo(CountBucketsFn(order), totals)  # a partial table per bundle
            | "BucketTable"
            >> beam.CombineGlobally(MergeBucketTablesFn()).without_defaults().with_output_types(SideDict),
            default_value={},
        )
        keyed = records | "KeyParts" >> beam.ParDo(KeyPartsFn(order), totals, table).with_output_types(
            Located
        ).with_outputs(_STRADDLING, main="parts")
        step = f"{self._name}/GroupStraddling"
        resolved = (
            keyed[_STRADDLING]
            # Declares the element type (tagged outputs have none), so the record coders are used.
            | "TypeStraddling" >> beam.Map(_same).with_output_types(_KeyedBatch)
            | "GroupStraddling" >> beam.GroupByKey()  # ((segment, bucket), [RecordBatch]): one hash bucket
            | "ResolveCuts"
            >> beam.ParDo(ResolveCutsFn(order, step), totals, table).with_output_types(Located)
        )
        parts = keyed.parts | "TypeParts" >> beam.Map(_same).with_output_types(Located)
        return (parts, resolved) | "Parts" >> beam.Flatten().with_output_types(Located)


class SetSplitsFn(beam.DoFn):
    """(split indexes, RecordBatch) -> RecordBatches with those splits set, batched again
    (BATCH_SIZE records; the bundle's rest when it finishes)."""

    def __init__(self, names: tuple[str, ...]):
        self._names = names

    def start_bundle(self) -> None:
        self._pending: list[RecordBatch] = []
        self._held = 0

    def process(self, located: Located) -> Iterator[RecordBatch]:
        parts, batch = located
        names = self._names
        self._pending.append(batch.with_columns(splits=tuple([names[p] for p in parts])))
        self._held += len(batch)
        if self._held >= BATCH_SIZE:
            *full, rest = RecordBatch.concat(self._pending).chunks()
            if len(rest) == BATCH_SIZE:
                full, rest = [*full, rest], None
            self._pending, self._held = ([rest], len(rest)) if rest else ([], 0)
            yield from full

    def finish_bundle(self) -> Iterator:
        if self._pending:
            yield GlobalWindows.windowed_value(RecordBatch.concat(self._pending))
            self._pending, self._held = [], 0


class HashRecords(beam.PTransform):
    """Adds each record's seeded hashes to its RecordBatch (cuts.record_hashes), once: the
    split hash and the shuffle hash every later layout step reads."""

    def __init__(self, seed: int):
        super().__init__()
        self._seed = seed

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        return records | beam.Map(with_hashes, self._seed).with_output_types(RecordBatch)


class AssignSplits(beam.PTransform):
    """Sets each record's split from a seeded hash of its path (unless `ratios` is empty).

    Every record leaves with its seeded hashes (HashRecords), which PlanShards reuses.
    With `stratify`, each class is cut at the ratios on its own, in the order of the same
    seeded hash (as `stratified_splits` would with the whole class), so class proportions
    are the same in every split, as closely as whole images allow. No class is gathered:
    per-class counts come from a combiner (a side input of one entry per class: 203k small
    ints for GLDv2), a class above 512 records is cut into hash buckets of 256-512 records
    (a bucket table of one entry per bucket), and only a class of up to 512 records, or one
    bucket of a larger class, that holds a cut is grouped (CutOrder). RecordBatches in,
    RecordBatches out.
    """

    def __init__(
        self, ratios: Sequence[tuple[str, float]] = (), seed: int = DEFAULT_SEED, stratify: bool = False
    ):
        super().__init__()
        self._ratios = tuple(ratios)
        self._seed = seed
        self._stratify = stratify

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        ratios, seed = self._ratios, self._seed
        hashed = records | "HashRecords" >> HashRecords(seed)
        if not ratios:
            return hashed
        names = tuple(name for name, _ in ratios)
        if not self._stratify:

            def hash_split(batch: RecordBatch) -> RecordBatch:
                split_hashes = cuts.hash_columns(with_hashes(batch, seed).hashes)[_SPLIT_HASH]
                return batch.with_columns(
                    splits=tuple([names[i] for i in split_indexes(split_hashes, ratios)])
                )

            return hashed | "HashSplit" >> beam.Map(hash_split).with_output_types(RecordBatch)

        order = _Order(
            seed=seed,
            segments=_class_keys,
            hash_column=_SPLIT_HASH,
            weights=None,
            layout=_split_layout(_cumulative(ratios)),
        )
        return (
            hashed
            | "CutClasses" >> CutOrder(order, f"{self.label}/CutClasses")  # (split indexes, RecordBatch)
            | "SetSplits" >> beam.ParDo(SetSplitsFn(names)).with_output_types(RecordBatch)
        )


class KeyShardsFn(beam.DoFn):
    """(shard indexes, RecordBatch) -> ((split, shard), RecordBatch), gathered per key over the
    bundle (batching.BatchGather: at most 50,000 records held)."""

    def start_bundle(self) -> None:
        self._gather = BatchGather()

    def process(self, located: Located) -> Iterator[_KeyedBatch]:
        parts, batch = located
        keys: dict[tuple[str, int], list[int]] = {}
        for i, key in enumerate(zip(batch.splits, parts)):
            keys.setdefault(key, []).append(i)
        for key, indices in keys.items():
            yield from self._gather.add(key, batch if len(indices) == len(batch) else batch.take(indices))

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)


class CutShardsFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> ShardTask: one shard's records in shuffled order."""

    def __init__(self, seed: int, step: str):
        self._seed = seed
        self._sizes = group_size(step)

    def process(self, element: tuple[tuple[str, int], Iterable[RecordBatch]]) -> Iterator[ShardTask]:
        (split, index), batches = element
        batch = with_hashes(RecordBatch.concat(batches), self._seed)
        keys = list(zip(cuts.hash_columns(batch.hashes)[_SHUFFLE_HASH].tolist(), batch.relpaths, batch.paths))
        order = sorted(range(len(batch)), key=keys.__getitem__)
        self._sizes.update(len(order))
        yield ShardTask(split=split, index=index, records=batch.take(order).records)


class PlanShards(beam.PTransform):
    """Cuts each split, in a seeded shuffled order, into ShardTasks without gathering a split.

    The shards are those of `plan_shards` on the whole split. Totals per split (count,
    estimated bytes) give the shard count and a hash-bucket resolution of about 8 buckets a
    shard; the bucket table's prefix sums place every bucket that lies inside one shard,
    and a straddling bucket is grouped and sorted to place its records exactly (CutOrder).
    Then one group per (split, shard): the largest group is one shard's metadata
    (ImageRecords, a few hundred bytes each), whatever the number of images.

    With `target_bytes` every shard but the last is within one record of the target at any
    shard size (so within 10% once a shard holds more than ~10 images of similar size; a
    single image larger than the target makes a shard of its own), and the last is at most
    one record over it. With `num_shards`, exactly that many shards unless one image weighs
    more than a shard (or there are fewer images than shards).
    """

    def __init__(self, seed: int, target_bytes: int | None, num_shards: int | None):
        super().__init__()
        if not target_bytes and not num_shards:
            raise ValueError("PlanShards needs target_bytes or num_shards")
        self._seed, self._target, self._num = seed, target_bytes, num_shards

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[ShardTask]:
        seed = self._seed
        order = _Order(
            seed=seed,
            segments=_splits,
            hash_column=_SHUFFLE_HASH,
            weights=record_sizes,
            layout=_shard_layout(self._target, self._num),
        )
        return (
            records
            | "HashRecords" >> HashRecords(seed)  # the same batches where AssignSplits hashed them
            | "CutSplits" >> CutOrder(order, f"{self.label}/CutSplits")  # (shard indexes, RecordBatch)
            | "KeyShards" >> beam.ParDo(KeyShardsFn()).with_output_types(_KeyedBatch)  # a shard in parts
            | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [RecordBatch]): one shard's metadata
            | "CutShards"
            >> beam.ParDo(CutShardsFn(seed, f"{self.label}/GroupByShard")).with_output_types(ShardTask)
        )
