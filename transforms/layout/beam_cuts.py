"""CutOrder: RecordBatches cut into exact parts of a seeded order without gathering a segment.

RecordBatches (with their seeded hashes, plan.with_hashes) in; Located out: each batch with
every record's part (a shard of PlanShards; the stratified splits of AssignSplits are placed
by CutClasses, beam_strata.py, which reuses the totals combiner and Located). The arithmetic
is transforms/layout/cuts.py; this module is its Beam shell: totals per segment and the bucket
table from one lifted combiner (SegmentSummaryFn; side inputs of small ints, SideDicts sized
without a walk), the records of a bucket inside one part placed where they are, and only a
straddling bucket grouped. Every group's size goes to a Beam distribution metric
(batching.group_size).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms import coders
from transforms.batching import KeyedGather, group_size
from transforms.coders import SideDict, record_batch_fields, record_batch_from_fields
from transforms.layout import cuts
from transforms.layout.plan import with_hashes
from transforms.records import RecordBatch

# The hash columns of RecordBatch.hashes (cuts.hash_columns).
SPLIT_HASH, SHUFFLE_HASH = 0, 1


def splits_of(batch: RecordBatch) -> Sequence[str]:
    return batch.splits


@dataclasses.dataclass(frozen=True)
class Order:
    """What CutOrder cuts, read from a RecordBatch's columns: each record's segment, its
    place in the seeded order (one of the batch's stored hashes), its weight, and each
    segment's bucket bits and part function from its totals."""

    seed: int
    segments: Callable[[RecordBatch], Sequence[str]]
    hash_column: int  # SPLIT_HASH or SHUFFLE_HASH
    weights: Callable[[RecordBatch], Sequence[int]] | None  # None: every record weighs 1
    # (segment, count, weight) -> (bucket bits, part function), from the totals alone
    layout: Callable[[str, int, int], tuple[int, Callable[[int], int]]]
    # One pass (SegmentSummaryFn) when set: the totals and each segment's bucket counts at
    # this fixed resolution from one combiner, the bucket table coarsened from them, and
    # every segment's bucket bits capped at it. For few segments (splits) only: the
    # combiner holds up to 2**fine_bits buckets a segment. CutOrder needs it; None for the
    # totals alone (SegmentTotalsFn: the class counts of CutClasses, beam_strata.py).
    fine_bits: int | None = None

    def bits_and_part(self, segment: str, count: int, weight: int) -> tuple[int, Callable[[int], int]]:
        """The segment's bucket bits (capped at fine_bits) and part function, from its totals."""
        bits, part = self.layout(segment, count, weight)
        return (min(bits, self.fine_bits) if self.fine_bits else bits), part

    def hashes(self, batch: RecordBatch) -> np.ndarray:
        return cuts.hash_columns(with_hashes(batch, self.seed).hashes)[self.hash_column]

    def weights_of(self, batch: RecordBatch) -> Sequence[int]:
        return self.weights(batch) if self.weights is not None else [1] * len(batch)

    def sort_keys(self, batch: RecordBatch) -> list[tuple[int, str, str]]:
        """Each record's place in the seeded order: its hash, ties broken by relpath, then path."""
        return list(zip(self.hashes(batch).tolist(), batch.relpaths, batch.paths))


class SegmentTotalsFn(beam.CombineFn):
    """RecordBatches -> {segment: [count, weight]}: one small entry per split or class."""

    def __init__(self, order: Order):
        self._order = order

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, batch: RecordBatch) -> dict:
        segments = self._order.segments(batch)
        if self._order.weights is None:
            get = acc.get
            for segment, n in collections.Counter(segments).items():
                entry = get(segment)
                if entry is None:
                    acc[segment] = [n, n]
                else:
                    entry[0] += n
                    entry[1] += n
        else:
            index: dict[str, int] = {}
            codes = np.fromiter((index.setdefault(s, len(index)) for s in segments), np.int64, len(segments))
            weights = np.asarray(self._order.weights(batch), dtype=np.int64)
            counts = np.bincount(codes, minlength=len(index)).tolist()
            sums = np.bincount(codes, weights=weights, minlength=len(index))  # exact below 2**53
            for segment, n, weight in zip(index, counts, sums.astype(np.int64).tolist()):
                cuts.add_totals(acc, segment, weight, count=n)
        return acc

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        return cuts.merge_totals(accs)

    def extract_output(self, acc: dict) -> dict:
        return acc


class SegmentSummaryFn(beam.CombineFn):
    """RecordBatches -> (totals, {segment: bucket histogram at order.fine_bits}) in one pass.

    The totals are SegmentTotalsFn's; the histograms (cuts.Histogram: sorted distinct
    buckets with their counts and weights) need no totals first, so no stage re-reads the
    records to count buckets. Bounded by the resolution: at most 2**fine_bits entries a
    segment (65,536 for shard planning: 1.5 MB a split), plus up to 64 batches' worth of
    entries not yet merged; only for few segments (splits).
    """

    _MERGE_EVERY = 64  # per-batch histograms held a segment before they are merged

    def __init__(self, order: Order):
        if not order.fine_bits:
            raise ValueError("SegmentSummaryFn needs an Order with fine_bits")
        self._order = order
        self._totals = SegmentTotalsFn(order)

    def create_accumulator(self) -> tuple[dict, dict]:
        return {}, {}

    def add_input(self, acc: tuple[dict, dict], batch: RecordBatch) -> tuple[dict, dict]:
        totals, hists = acc
        self._totals.add_input(totals, batch)
        order = self._order
        segments = order.segments(batch)
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(s, len(index)) for s in segments), np.int64, len(segments))
        fine = cuts.bucket_array(order.hashes(batch), order.fine_bits)
        weights = np.asarray(order.weights_of(batch), dtype=np.int64)
        ones = np.ones(len(segments), dtype=np.int64)
        for code, seg in enumerate(index):
            mine = slice(None) if len(index) == 1 else codes == code
            parts = hists.setdefault(seg, [])
            parts.append(cuts.histogram(fine[mine], ones[mine], weights[mine]))
            if len(parts) >= self._MERGE_EVERY:
                hists[seg] = [cuts.merge_histograms(parts)]
        return acc

    def merge_accumulators(self, accs: Iterable[tuple[dict, dict]]) -> tuple[dict, dict]:
        accs = list(accs)
        hists: dict[str, list] = {}
        for _, acc_hists in accs:
            for seg, parts in acc_hists.items():
                hists.setdefault(seg, []).extend(parts)
        merged = {seg: [cuts.merge_histograms(parts)] for seg, parts in hists.items()}
        return cuts.merge_totals(totals for totals, _ in accs), merged

    def extract_output(self, acc: tuple[dict, dict]) -> tuple[dict, dict]:
        totals, hists = acc
        return totals, {seg: cuts.merge_histograms(parts) for seg, parts in hists.items()}


def _summary_totals(summary: tuple[dict, dict]) -> SideDict:
    return SideDict(summary[0])


def _summary_table(summary: tuple[dict, dict], order: Order) -> SideDict:
    """The bucket table of a summary: each segment's histogram coarsened to its bucket bits."""
    totals, hists = summary
    table = {}
    for seg, (count, weight) in totals.items():
        bits = order.bits_and_part(seg, count, weight)[0]
        if bits:
            table[seg] = cuts.coarsen(hists[seg], order.fine_bits, bits)
    return SideDict(table)


class _Plans:
    """Each segment's SegmentPlan, built on first use from the totals and bucket table.

    A segment's layout depends on its totals alone, so segments of one bucket (most classes)
    with the same totals share one plan: 200,000 small classes make a few hundred plans.
    """

    def __init__(self, order: Order, totals: dict, table: dict):
        self._order, self._totals, self._table = order, totals, table
        self._plans: dict[str, cuts.SegmentPlan] = {}
        self._one_bucket: dict[tuple[int, int], cuts.SegmentPlan] = {}

    def get(self, segment: str) -> cuts.SegmentPlan:
        plan = self._plans.get(segment)
        if plan is None:
            count, weight = self._totals[segment]
            plan = self._one_bucket.get((count, weight))
            if plan is None:
                bits, part = self._order.bits_and_part(segment, count, weight)
                plan = cuts.segment_plan(bits, part, weight, self._table.get(segment, {}))
                if not bits:
                    self._one_bucket[count, weight] = plan
            self._plans[segment] = plan
        return plan


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

    def extract_output(self, acc: dict) -> dict:
        return acc


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
    return coders.untagged(data, lambda t: Located(t[0], record_batch_from_fields(t[1:])))


class LocatedCoder(coders.TupleCoder):
    _type, _encode, _decode = Located, _encode_located, _decode_located


CODERS = {Located: LocatedCoder}  # registered by beam_pipeline/pipeline.py `register_coders`

KeyedBatch = tuple[tuple[str, int], RecordBatch]


def _locate(
    order: Order, plans: _Plans, batch: RecordBatch
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Each record's part (cuts.STRADDLES where its bucket holds a cut) and bucket, its
    segment's code and the segment names: per segment of the batch, not per record (its
    plan once; its part at once when it is one bucket; else a binary search a record)."""
    segments = order.segments(batch)
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(s, len(index)) for s in segments), np.int64, len(segments))
    names = list(index)
    seg_plans = [plans.get(s) for s in names]
    parts = np.array([p.whole_part() for p in seg_plans], dtype=np.int64)[codes]
    buckets = np.zeros(len(segments), dtype=np.uint64)
    bucketed = np.flatnonzero(parts == cuts.BUCKETED)
    if bucketed.size:  # segments with bucket bits: each record's part is its bucket's
        hashes = order.hashes(batch)
        for code in np.unique(codes[bucketed]).tolist():
            mine = bucketed[codes[bucketed] == code]
            buckets[mine] = cuts.bucket_array(hashes[mine], seg_plans[code].bits)
            parts[mine] = seg_plans[code].parts_of_buckets(buckets[mine])
    return parts, buckets, codes, names


class _PlannedFn(beam.DoFn):
    """A DoFn that reads the plan's side inputs (totals, bucket table): their _Plans, per worker."""

    def __init__(self, order: Order):
        self._order = order

    def setup(self) -> None:
        self._plans: _Plans | None = None
        self._sides: tuple = ()

    def plans(self, totals: dict, table: dict) -> _Plans:
        if self._plans is None or self._sides[0] is not totals or self._sides[1] is not table:
            self._plans, self._sides = _Plans(self._order, totals, table), (totals, table)
        return self._plans


class StraddlingFn(_PlannedFn):
    """RecordBatch -> ((segment, bucket), RecordBatch) of its records whose bucket holds a cut
    (most batches: none), gathered per key over the bundle (batching.KeyedGather: at most
    50,000 records held). The other records are placed by KeyPartsFn, in a later pass."""

    def start_bundle(self) -> None:
        self._straddling = KeyedGather()

    def process(self, batch: RecordBatch, totals: dict, table: dict) -> Iterator:
        parts, buckets, codes, names = _locate(self._order, self.plans(totals, table), batch)
        at = np.flatnonzero(parts == cuts.STRADDLES)
        if at.size:
            keys = zip(map(names.__getitem__, codes[at].tolist()), buckets[at].tolist())
            yield from self._straddling.add(batch.take(at.tolist()), keys)

    def finish_bundle(self) -> Iterator:
        for item in self._straddling.drain():
            yield GlobalWindows.windowed_value(item)


def _order_keys(order: Order, batch: RecordBatch) -> list[tuple[bytes, str, str]]:
    """Each record's place in the seeded order as (hash as 8 big-endian bytes, relpath, path):
    ordered as Order.sort_keys, and coded by the primitive coder (a 64-bit int may not be)."""
    raw = with_hashes(batch, order.seed).hashes
    start = 8 * order.hash_column
    hashes = [raw[i + start : i + start + 8] for i in range(0, len(raw), 16)]
    return list(zip(hashes, batch.relpaths, batch.paths))


class BoundariesFn(_PlannedFn):
    """((segment, bucket), [RecordBatch]) -> ((segment, bucket), boundaries): one straddling
    bucket sorted, each record placed by its exact weight offset; `boundaries` is the sort key
    (_order_keys) of the first record of each part in the bucket, with that part. The group
    is one bucket."""

    def __init__(self, order: Order, step: str):
        super().__init__(order)
        self._sizes = group_size(step)

    def process(
        self, element: tuple[tuple[str, int], Iterable[RecordBatch]], totals: dict, table: dict
    ) -> Iterator[tuple[tuple[str, int], tuple]]:
        (seg, bucket), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        plan = self.plans(totals, table).get(seg)
        start, _ = plan.bucket_range(bucket)
        keys, weights = _order_keys(self._order, batch), self._order.weights_of(batch)
        boundaries, last = [], None
        for part, i in cuts.resolve_bucket(
            range(len(batch)), start, plan.part_of, keys.__getitem__, weights.__getitem__
        ):
            if part != last:
                boundaries.append((keys[i], part))
                last = part
        yield (seg, bucket), tuple(boundaries)


def _part_codes(codes: np.ndarray, parts: np.ndarray, names: list[str]) -> tuple[np.ndarray, list]:
    """(codes, keys) of each record's (segment, part) key (KeyedGather.add_coded): one numpy
    pass over the records, a key tuple per distinct (segment, part) of the batch."""
    if not len(parts):
        return parts, []
    width = int(parts.max()) + 1
    distinct, inverse = np.unique(codes * width + parts, return_inverse=True)
    return inverse.reshape(-1), [(names[d // width], d % width) for d in distinct.tolist()]


class KeyPartsFn(_PlannedFn):
    """RecordBatch -> ((segment, part), RecordBatch), gathered per key over the bundle
    (batching.KeyedGather: at most 50,000 records held): a record whose bucket lies in one
    part gets it from the plan; a record of a straddling bucket from that bucket's
    boundaries (a side input: one entry per straddling bucket, about one per shard)."""

    def setup(self) -> None:
        super().setup()
        self._bounds: dict | None = None
        self._lists: dict = {}

    def start_bundle(self) -> None:
        self._gather = KeyedGather()

    def process(self, batch: RecordBatch, totals: dict, table: dict, boundaries: dict) -> Iterator:
        parts, buckets, codes, names = _locate(self._order, self.plans(totals, table), batch)
        at = np.flatnonzero(parts == cuts.STRADDLES)
        if at.size:
            if self._bounds is not boundaries:
                self._bounds, self._lists = boundaries, {}
            keys = _order_keys(self._order, batch.take(at.tolist()))  # the straddling records' only
            for j, (i, code, bucket) in enumerate(zip(at.tolist(), codes[at].tolist(), buckets[at].tolist())):
                lists = self._lists.get((code_name := names[code], bucket))
                if lists is None:
                    bounds = boundaries[code_name, bucket]
                    lists = self._lists[code_name, bucket] = ([k for k, _ in bounds], [p for _, p in bounds])
                parts[i] = lists[1][bisect.bisect_right(lists[0], keys[j]) - 1]
        yield from self._gather.add_coded(batch, *_part_codes(codes, parts, names))

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)


class CutOrder(beam.PTransform):
    """RecordBatches -> ((segment, part), RecordBatch): every record with its exact part,
    gathered per (segment, part) for the GroupByKey that follows.

    One lifted combiner gives the totals per segment (one entry per split) and the bucket
    table (SegmentSummaryFn: at most 2**order.fine_bits buckets a segment, coarsened to the
    bits of each segment's totals): side inputs of a few small ints per segment or bucket,
    materialized once. For few segments only (splits); classes are cut by CutClasses
    (beam_strata.py). A straddling bucket (one that holds a cut) is grouped (one bucket's
    records: the only group here) and sorted, and gives the sort keys where its parts start:
    a side input of one small entry per straddling bucket. Then one pass places every
    record, from the bucket table or from those boundaries, with no Flatten of two streams
    (which the local runner writes and reads back whole). The records must carry their
    seeded hashes (plan.with_hashes).
    """

    def __init__(self, order: Order, name: str):
        """name: the transform's full label, e.g. 'PlanShards/CutSplits', for the group metric."""
        super().__init__()
        self._order, self._name = order, name

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[KeyedBatch]:
        order = self._order
        if not order.fine_bits:
            raise ValueError("CutOrder needs an Order with fine_bits")
        # One pass: totals and fine bucket counts, the table coarsened from them.
        summary = records | "Summary" >> beam.CombineGlobally(SegmentSummaryFn(order)).without_defaults()
        totals = pvalue.AsSingleton(
            summary | "TotalsSide" >> beam.Map(_summary_totals).with_output_types(SideDict),
            default_value={},
        )
        table = pvalue.AsSingleton(
            summary | "BucketTableSide" >> beam.Map(_summary_table, order).with_output_types(SideDict),
            default_value={},
        )
        step = f"{self._name}/GroupStraddling"
        boundaries = pvalue.AsSingleton(
            records
            | "Straddling" >> beam.ParDo(StraddlingFn(order), totals, table).with_output_types(KeyedBatch)
            | "GroupStraddling" >> beam.GroupByKey()  # ((segment, bucket), [RecordBatch]): one hash bucket
            | "Boundaries" >> beam.ParDo(BoundariesFn(order, step), totals, table)
            | "AllBoundaries" >> beam.combiners.ToDict()
            | "BoundariesSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {(segment, bucket): ((sort key, part), ...)}: one entry per straddling bucket
        return records | "KeyParts" >> beam.ParDo(
            KeyPartsFn(order), totals, table, boundaries
        ).with_output_types(KeyedBatch)
