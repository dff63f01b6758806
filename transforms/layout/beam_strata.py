"""CutClasses: stratified splits in bounded groups, the Beam shell of transforms/layout/strata.py.

RecordBatches (with their seeded hashes, plan.with_hashes) in; Located out: every record with
its split index, exactly as `plan.stratified_splits` would give with each class sorted whole.

One pass over the records after the class counts: every record goes to one group (a pack of
small classes, or one hash bucket of a class above 512 records; strata.py) and is placed there.
No record is placed apart from the groups, so no Flatten joins two streams again (the local
runner writes and reads back every record at a Flatten), and the bucket counts of the big
classes come from the same pass that keys the records. Side inputs: the class counts (one
int per class: 203,094 for GLDv2) and the bucket table (one entry per 256-512
records of the classes above 512 records), both SideDicts sized without a walk.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import KeyedGather, group_size
from transforms.coders import SideDict
from transforms.layout import cuts, strata
from transforms.layout.beam_cuts import SPLIT_HASH, Located, MergeBucketTablesFn
from transforms.layout.plan import _SPLIT_BUCKET, with_hashes
from transforms.records import RecordBatch

# KeyClassesFn's output of bucket counts (big classes only).
_COUNTS = "bucket_counts"

GroupKey = tuple[int, str, int]
KeyedClasses = tuple[GroupKey, RecordBatch]


class ClassCountsFn(beam.CombineFn):
    """RecordBatches -> {class: records}: one small int a class (a lifted combiner).

    Plain ints, not [count, weight] lists: the garbage collector walks every container a
    process holds, and 200,000 lists per copy of the counts (accumulators, side inputs)
    made its full passes cost more than the counting.
    """

    def create_accumulator(self) -> dict[str, int]:
        return {}

    def add_input(self, counts: dict[str, int], batch: RecordBatch) -> dict[str, int]:
        get = counts.get
        for name, n in collections.Counter(batch.class_keys()).items():
            counts[name] = get(name, 0) + n
        return counts

    def merge_accumulators(self, accumulators: Iterable[dict[str, int]]) -> dict[str, int]:
        it = iter(accumulators)
        merged = dict(next(it, {}))
        get = merged.get
        for counts in it:
            for name, n in counts.items():
                merged[name] = get(name, 0) + n
        return merged

    def extract_output(self, counts: dict[str, int]) -> dict[str, int]:
        return counts


class KeyClassesFn(beam.DoFn):
    """RecordBatch -> (group key, RecordBatch) parts, gathered per key over the bundle
    (batching.KeyedGather: at most 50,000 records held); on _COUNTS, one partial bucket table
    a bundle ({class: {bucket: [count, count]}}) of the classes above the pack size."""

    def __init__(self, seed: int, bucket: int):
        self._seed, self._bucket = seed, bucket

    def setup(self) -> None:
        self._totals: dict | None = None
        self._packs: strata.Packs | None = None

    def start_bundle(self) -> None:
        self._gather = KeyedGather()
        self._counts: dict[tuple[str, int], int] = {}

    def process(self, batch: RecordBatch, counts: dict) -> Iterator:
        if self._totals is not counts:  # the packs of a side input, once per worker
            self._packs, self._totals = strata.Packs(counts, self._bucket), counts
        batch = with_hashes(batch, self._seed)
        hashes = cuts.hash_columns(batch.hashes)[SPLIT_HASH]
        codes, keys = strata.group_keys(batch.class_keys(), hashes, self._packs)
        buckets = self._counts
        if any(key[0] == strata._BUCKET for key in keys):
            for key, n in zip(keys, np.bincount(codes, minlength=len(keys)).tolist()):
                if key[0] == strata._BUCKET:
                    buckets[key[1:]] = buckets.get(key[1:], 0) + n
        yield from self._gather.add_coded(batch, codes, keys)

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)
        if self._counts:
            table: dict = {}
            for (name, bucket), n in self._counts.items():
                table.setdefault(name, {})[bucket] = [n, n]
            self._counts = {}
            yield pvalue.TaggedOutput(_COUNTS, GlobalWindows.windowed_value(table))


class ResolveClassesFn(beam.DoFn):
    """(group key, [RecordBatch]) -> Located: every record of one group with its split index.
    The group is a pack of small classes (at most `bucket` records) or one hash bucket."""

    def __init__(self, cumulative: tuple[float, ...], step: str):
        self._cumulative = cumulative
        self._sizes = group_size(step)

    def setup(self) -> None:
        self._table: dict | None = None
        self._starts: dict[str, dict[int, int]] = {}

    def process(self, element: tuple[GroupKey, Iterable[RecordBatch]], counts: dict, table: dict) -> Iterator:
        (kind, name, number), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        start = 0
        if kind == strata._BUCKET:
            if self._table is not table:
                self._starts, self._table = {}, table
            starts = self._starts.get(name)
            if starts is None:
                starts = self._starts[name] = strata.bucket_starts(table[name])
            start = starts[number]
        parts = strata.split_indexes_in_group(
            batch.class_keys(),
            cuts.hash_columns(batch.hashes)[SPLIT_HASH],
            batch.relpaths,
            batch.paths,
            counts if kind == strata._BUCKET else None,  # a pack holds its classes whole
            self._cumulative,
            start,
        )
        yield Located(tuple(parts.tolist()), batch)


def _same(element: object) -> object:
    return element


class CutClasses(beam.PTransform):
    """RecordBatches -> Located: each record with its stratified split index (an index into
    the ratios whose cumulative sums are `cumulative`).

    The class counts come from a lifted combiner (a side input of one int per class); then
    one ParDo keys every record by its group (strata.group_keys) and counts the hash buckets of
    the classes above `bucket` records (a side input of one entry per bucket); one GroupByKey
    (a group: a pack of small classes of at most `bucket` records, or one hash bucket) places
    every record. The records must carry their seeded hashes (plan.with_hashes) or get them here.
    """

    def __init__(self, seed: int, cumulative: tuple[float, ...], name: str, bucket: int | None = None):
        """name: the transform's full label, e.g. 'AssignSplits/CutClasses', for the group metric."""
        super().__init__()
        self._seed, self._cumulative, self._name = seed, cumulative, name
        self._bucket = bucket or _SPLIT_BUCKET

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[Located]:
        counts = pvalue.AsSingleton(
            records
            | "Counts" >> beam.CombineGlobally(ClassCountsFn()).without_defaults()
            | "CountsSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {class: records}: one small int a class
        keyed = records | "KeyClasses" >> beam.ParDo(
            KeyClassesFn(self._seed, self._bucket), counts
        ).with_output_types(KeyedClasses).with_outputs(_COUNTS, main="groups")
        table = pvalue.AsSingleton(
            keyed[_COUNTS]
            | "BucketTable" >> beam.CombineGlobally(MergeBucketTablesFn()).without_defaults()
            | "BucketTableSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {class: {bucket: [count, count]}}: the classes above `bucket` records only
        return (
            keyed.groups
            | "GroupClasses"
            >> beam.GroupByKey()  # (group key, [RecordBatch]): <= `bucket` records, or one bucket
            | "ResolveClasses"
            >> beam.ParDo(
                ResolveClassesFn(self._cumulative, f"{self._name}/GroupClasses"), counts, table
            ).with_output_types(Located)
        )
