"""Dataset layout: split assignment, a deterministic global shuffle and shard planning.

RecordBatches of ImageRecord metadata in (transforms/records.py); RecordBatches with each
record's split set (AssignSplits) and ShardTasks, one shard's records in write order
(PlanShards), out. No image bytes are read here.

The shuffle is a seeded hash of each image's relative path, computed once (HashRecords), so
the same input and seed give the same shards on any runner and with any number of workers,
and classes are mixed inside every shard. A shard is a range of that hash, sized from its
split's totals (as TensorFlow Datasets' BeamWriter assigns shards), and written in hash order.
Neither a split nor a class is ever gathered on one worker: the only groups are one shard's
records, or (--stratify, strata.py, beam_strata.py) a pack of small classes of at most 512
records or one hash bucket of a bigger class. Every group's size goes to a Beam distribution
metric (batching.group_size).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import KeyedGather, SumPerKeyFn, group_size
from transforms.coders import SideDict
from transforms.layout.beam_strata import CutClasses
from transforms.layout.plan import (
    BYTES,
    DEFAULT_SEED,
    RECORDS,
    SHUFFLE_HASH,
    SPLIT_HASH,
    hash_columns,
    shard_indexes,
    shard_units,
    shuffle_order,
    split_indexes,
    split_totals,
    with_hashes,
)
from transforms.records import RecordBatch, ShardTask


class HashRecords(beam.PTransform):
    """Adds each record's seeded hashes to its RecordBatch (plan.record_hashes), once: the
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
    seeded hash (as sorting the whole class would), so class proportions are the same in
    every split, as closely as whole images allow. No class is gathered: per-class counts
    come from a combiner (a side input of one entry per class: 203k small ints for GLDv2),
    and every record is placed in one group (CutClasses): a pack of small classes of at most
    512 records in all, or one hash bucket of 256-512 records of a larger class (a bucket
    table of one entry per bucket). RecordBatches in, RecordBatches out.
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
        if self._stratify:
            return hashed | "CutClasses" >> CutClasses(seed, ratios, f"{self.label}/CutClasses")
        names = tuple(name for name, _ in ratios)

        def hash_split(batch: RecordBatch) -> RecordBatch:
            split_hashes = hash_columns(batch.hashes)[SPLIT_HASH]
            return batch.with_columns(splits=tuple([names[i] for i in split_indexes(split_hashes, ratios)]))

        return hashed | "HashSplit" >> beam.Map(hash_split).with_output_types(RecordBatch)


KeyedBatch = tuple[tuple[str, int], RecordBatch]


class KeyShardsFn(beam.DoFn):
    """RecordBatch -> ((split, shard), RecordBatch), gathered per key over the bundle
    (batching.KeyedGather: at most 50,000 records held). A record's shard is its shuffle
    hash's range (plan.shard_indexes), from its split's totals (a side input: two ints a split)."""

    def __init__(self, target_bytes: int | None, num_shards: int | None, max_records: int | None):
        self._shape = target_bytes, num_shards, max_records

    def start_bundle(self) -> None:
        self._gather = KeyedGather()

    def process(self, batch: RecordBatch, totals: dict) -> Iterator[KeyedBatch]:
        index: dict[str, int] = {}
        splits = batch.splits
        codes = np.fromiter((index.setdefault(s, len(index)) for s in splits), np.int64, len(splits))
        names = list(index)
        hashes = hash_columns(batch.hashes)[SHUFFLE_HASH]
        units = np.array([shard_units(totals[s, RECORDS], totals[s, BYTES], *self._shape) for s in names])
        shards = shard_indexes(hashes, units[codes])
        width = int(shards.max(initial=0)) + 1
        distinct, inverse = np.unique(codes * width + shards, return_inverse=True)
        keys = [(names[d // width], d % width) for d in distinct.tolist()]
        yield from self._gather.add_coded(batch, inverse.reshape(-1), keys)

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)


class CutShardsFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> ShardTask: one shard's records in shuffled order."""

    def __init__(self, step: str):
        self._sizes = group_size(step)

    def process(self, element: tuple[tuple[str, int], Iterable[RecordBatch]]) -> Iterator[ShardTask]:
        (split, index), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        yield ShardTask(split, index, batch.take(shuffle_order(batch)))


class PlanShards(beam.PTransform):
    """Cuts each split into ShardTasks by ranges of its seeded shuffle hash, without
    gathering a split (TensorFlow Datasets' BeamWriter: shard from the hash range, the
    totals as side inputs, one group per shard).

    One lifted combiner sums each split's records and estimated bytes (a side input of two
    ints a split); then every record goes to the shard that holds its hash (plan.shard_units,
    shard_indexes) and one GroupByKey gathers each (split, shard): the largest group is one
    shard's metadata (a few hundred bytes a record), whatever the number of images.

    With `target_bytes` each shard but the last holds a range of the hash worth the target
    on average (within 10% from 1,000 records a shard up; a shard of a few dozen records
    varies more), the last the rest. With `max_records` too, a split has at least
    records / max_records shards: a shard of tiny images holds about `max_records` records
    (a few % more at most) and fewer bytes than the target. With `num_shards`, that many
    equal ranges (at most one a record); a range that holds no record makes no shard, and
    the shards are numbered again when written. The order inside a shard is the hash order.
    """

    def __init__(
        self,
        seed: int,
        target_bytes: int | None,
        num_shards: int | None,
        max_records: int | None = None,
    ):
        super().__init__()
        if not target_bytes and not num_shards:
            raise ValueError("PlanShards needs target_bytes or num_shards")
        self._seed = seed
        self._shape = (None, num_shards, None) if num_shards else (target_bytes, None, max_records)

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[ShardTask]:
        hashed = records | "HashRecords" >> HashRecords(self._seed)  # the batches AssignSplits hashed
        totals = pvalue.AsSingleton(
            hashed
            | "Totals" >> beam.CombineGlobally(SumPerKeyFn(split_totals)).without_defaults()
            | "TotalsSide" >> beam.Map(SideDict).with_output_types(SideDict),
            default_value={},
        )  # {(split, RECORDS or BYTES): int}: two ints a split
        return (
            hashed
            | "KeyShards" >> beam.ParDo(KeyShardsFn(*self._shape), totals).with_output_types(KeyedBatch)
            | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [RecordBatch]): one shard's metadata
            | "CutShards"
            >> beam.ParDo(CutShardsFn(f"{self.label}/GroupByShard")).with_output_types(ShardTask)
        )
