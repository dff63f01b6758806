"""CutClasses: stratified splits in bounded groups, the Beam shell of strata.py.

RecordBatches (with their seeded hashes) in; RecordBatches with every record's split out,
exactly as each class sorted whole would give (tests/layout/reference.py). After the class
counts, one pass keys every record to its group (a pack of small classes, or one hash bucket
of a class above 512 records) and counts the big classes' buckets; one GroupByKey places every
record (no Flatten of two streams: the local runner writes and reads back every record at a
Flatten). Side inputs: the class counts (one int per class: 203,094 for GLDv2) and the bucket
table (one entry per 256-512 records of the big classes), both SideDicts sized without a walk.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import KeyedGather, SumPerKeyFn, group_size
from transforms.coders import SideDict
from transforms.layout import strata
from transforms.layout.plan import SPLIT_HASH, cumulative, hash_columns
from transforms.records import BATCH_SIZE, RecordBatch

# Records per hash bucket of a class above this size, and at most per pack of small classes.
_SPLIT_BUCKET = 512

# KeyClassesFn's output of bucket counts (big classes only).
_COUNTS = "bucket_counts"

GroupKey = tuple[int, str, int]
KeyedClasses = tuple[GroupKey, RecordBatch]


def class_counts(batch: RecordBatch) -> Iterable[tuple[str, int]]:
    """(class, records) per class of `batch`, summed into the class counts (SumPerKeyFn)."""
    return collections.Counter(batch.class_keys()).items()


class KeyClassesFn(beam.DoFn):
    """RecordBatch -> (group key, RecordBatch) parts, gathered per key over the bundle
    (batching.KeyedGather: at most 50,000 records held); on _COUNTS, one partial bucket table
    a bundle ({(class, bucket): records} of the classes above the pack size)."""

    def __init__(self, bucket: int):
        self._bucket = bucket

    def setup(self) -> None:
        self._totals: dict | None = None
        self._packs: strata.Packs | None = None

    def start_bundle(self) -> None:
        self._gather = KeyedGather()
        self._counts: dict[tuple[str, int], int] = {}

    def process(self, batch: RecordBatch, counts: dict) -> Iterator:
        if self._totals is not counts:  # the packs of a side input, once per worker
            self._packs, self._totals = strata.Packs(counts, self._bucket), counts
        hashes = hash_columns(batch.hashes)[SPLIT_HASH]
        codes, keys = strata.group_keys(batch.class_keys(), hashes, self._packs)
        for key, n in zip(keys, np.bincount(codes, minlength=len(keys)).tolist()):
            if key[0] == strata._BUCKET:
                self._counts[key[1:]] = self._counts.get(key[1:], 0) + n
        yield from self._gather.add_coded(batch, codes, keys)

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)
        if self._counts:
            table, self._counts = self._counts, {}
            yield pvalue.TaggedOutput(_COUNTS, GlobalWindows.windowed_value(table))


class ResolveClassesFn(beam.DoFn):
    """(group key, [RecordBatch]) -> RecordBatches with each record's split set, batched again
    (BATCH_SIZE records; the bundle's rest when it finishes)."""

    def __init__(self, names: tuple[str, ...], cumulative: tuple[float, ...], step: str):
        self._names, self._cumulative = names, cumulative
        self._sizes = group_size(step)

    def setup(self) -> None:
        self._table: dict | None = None
        self._starts: dict[tuple[str, int], int] = {}

    def start_bundle(self) -> None:
        self._pending: list[RecordBatch] = []
        self._held = 0

    def process(self, element: tuple[GroupKey, Iterable[RecordBatch]], counts: dict, table: dict) -> Iterator:
        (kind, name, number), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        big = kind == strata._BUCKET
        if big and self._table is not table:  # the starts of a side input, once per worker
            self._starts, self._table = strata.bucket_starts(table), table
        parts = strata.split_indexes_in_group(
            batch.class_keys(),
            hash_columns(batch.hashes)[SPLIT_HASH],
            batch.relpaths,
            batch.paths,
            counts if big else None,  # a pack holds its classes whole
            self._cumulative,
            self._starts[name, number] if big else 0,
        )
        self._pending.append(batch.with_columns(splits=tuple([self._names[p] for p in parts.tolist()])))
        self._held += len(batch)
        if self._held >= BATCH_SIZE:
            joined = RecordBatch.concat(self._pending)
            full = len(joined) - len(joined) % BATCH_SIZE
            yield from joined.slice(0, full).chunks()
            rest = joined.slice(full, len(joined))
            self._pending, self._held = ([rest] if len(rest) else []), len(rest)

    def finish_bundle(self) -> Iterator:
        if self._pending:
            yield GlobalWindows.windowed_value(RecordBatch.concat(self._pending))
            self._pending, self._held = [], 0


class CutClasses(beam.PTransform):
    """Hashed RecordBatches -> RecordBatches with each record's stratified split (of `ratios`)."""

    def __init__(self, ratios: tuple[tuple[str, float], ...], name: str):
        """name: the transform's full label, e.g. 'AssignSplits/CutClasses', for the group metric."""
        super().__init__()
        self._ratios, self._name = ratios, name

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        counts = pvalue.AsSingleton(
            records
            | "Counts" >> beam.CombineGlobally(SumPerKeyFn(class_counts)).without_defaults()
            | "CountsSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {class: records}: one small int a class
        keyed = records | "KeyClasses" >> beam.ParDo(KeyClassesFn(_SPLIT_BUCKET), counts).with_output_types(
            KeyedClasses
        ).with_outputs(_COUNTS, main="groups")
        table = pvalue.AsSingleton(
            keyed[_COUNTS]
            | "BucketTable" >> beam.CombineGlobally(SumPerKeyFn(dict.items)).without_defaults()
            | "BucketTableSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {(class, bucket): records}: the big classes only
        resolve = ResolveClassesFn(
            tuple(name for name, _ in self._ratios), cumulative(self._ratios), f"{self._name}/GroupClasses"
        )
        return (
            keyed.groups
            | "GroupClasses" >> beam.GroupByKey()  # (group key, [RecordBatch]): <= 512 records, or one bucket
            | "ResolveClasses" >> beam.ParDo(resolve, counts, table).with_output_types(RecordBatch)
        )
