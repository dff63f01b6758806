"""AssignSplits and PlanShards: splits, a deterministic global shuffle and the shard plan.

RecordBatches of ImageRecord metadata in; RecordBatches with each record's split (AssignSplits)
and ShardTasks, one shard's records in write order (PlanShards), out. No image bytes are read.

The shuffle is a seeded hash of each image's relative path, computed once (plan.with_hashes),
so the same input and seed give the same shards on any runner and any number of workers, and
classes are mixed inside every shard. Neither a split nor a class is ever gathered on one
worker: the only groups are one shard's records or (--stratify, beam_strata.py) a pack of small
classes of at most 512 records or one hash bucket of a bigger class. Every group's size goes to
a Beam distribution metric (batching.group_size).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import KeyedGather, SumPerKeyFn, group_size
from transforms.layout.beam_strata import CutClasses
from transforms.layout.plan import (
    DEFAULT_SEED,
    RECORDS,
    SHUFFLE_HASH,
    SPLIT_HASH,
    WEIGHTS,
    hash_columns,
    shard_indexes,
    shard_scale,
    shuffle_order,
    split_indexes,
    split_weights,
    weight_floor,
    with_hashes,
)
from transforms.records import RecordBatch, ShardTask


class AssignSplits(beam.PTransform):
    """Sets each record's split from a seeded hash of its path (unless `ratios` is empty).

    Every record leaves with its seeded hashes, which PlanShards reuses. With `stratify`,
    each class is cut at the ratios on its own, in the order of the same seeded hash, so class
    proportions are the same in every split as closely as whole images allow (CutClasses).
    """

    def __init__(
        self, ratios: Sequence[tuple[str, float]] = (), seed: int = DEFAULT_SEED, stratify: bool = False
    ):
        super().__init__()
        self._ratios, self._seed, self._stratify = tuple(ratios), seed, stratify

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[RecordBatch]:
        ratios = self._ratios
        hashed = records | "HashRecords" >> beam.Map(with_hashes, self._seed).with_output_types(RecordBatch)
        if not ratios:
            return hashed
        if self._stratify:
            return hashed | "CutClasses" >> CutClasses(ratios, f"{self.label}/CutClasses")
        names = tuple(name for name, _ in ratios)

        def hash_split(batch: RecordBatch) -> RecordBatch:
            split_hashes = hash_columns(batch.hashes)[SPLIT_HASH]
            return batch.with_columns(splits=tuple([names[i] for i in split_indexes(split_hashes, ratios)]))

        return hashed | "HashSplit" >> beam.Map(hash_split).with_output_types(RecordBatch)


KeyedBatch = tuple[tuple[str, int], RecordBatch]


class KeyShardsFn(beam.DoFn):
    """RecordBatch -> ((split, shard), RecordBatch) parts, gathered per key over the bundle
    (batching.KeyedGather: at most 50,000 records held); each record's shard from its split's
    totals (plan.shard_indexes)."""

    def __init__(self, target_bytes: int | None, num_shards: int | None):
        self._target, self._num = target_bytes, num_shards

    def setup(self) -> None:
        self._totals: dict | None = None
        self._scales: dict = {}

    def start_bundle(self) -> None:
        self._gather = KeyedGather()

    def process(self, batch: RecordBatch, totals: dict) -> Iterator[KeyedBatch]:
        if self._totals is not totals:  # each split's scale once per side input
            self._totals, self._scales = totals, {}
        index: dict[str, int] = {}
        splits = batch.splits
        codes = np.fromiter((index.setdefault(s, len(index)) for s in splits), np.int64, len(splits))
        names = list(index)
        hashes = hash_columns(batch.hashes)[SHUFFLE_HASH]
        shards = np.empty(len(splits), dtype=np.int64)
        for code, split in enumerate(names):
            if split not in self._scales:
                records, weights = totals[split, RECORDS], totals[split, WEIGHTS]
                self._scales[split] = shard_scale(records, weights, self._target, self._num)
            mine = slice(None) if len(names) == 1 else codes == code
            shards[mine] = shard_indexes(hashes[mine], *self._scales[split])
        width = int(shards.max(initial=0)) + 1
        distinct, inverse = np.unique(codes * width + shards, return_inverse=True)
        keys = [(names[d // width], d % width) for d in distinct.tolist()]
        yield from self._gather.add_coded(batch, inverse.reshape(-1), keys)

    def finish_bundle(self) -> Iterator:
        for item in self._gather.drain():
            yield GlobalWindows.windowed_value(item)


class CutShardsFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> ShardTask: one shard's records in hash order."""

    def __init__(self, step: str):
        self._sizes = group_size(step)

    def process(self, element: tuple[tuple[str, int], Iterable[RecordBatch]]) -> Iterator[ShardTask]:
        (split, index), batches = element
        batch = RecordBatch.concat(batches)
        self._sizes.update(len(batch))
        yield ShardTask(split, index, batch.take(shuffle_order(batch)))


class PlanShards(beam.PTransform):
    """Cuts each split into ShardTasks by ranges of its seeded shuffle hash, as TensorFlow
    Datasets' BeamWriter does: the totals as a side input, one group per shard.

    A lifted combiner sums each split's record count and planning weight (estimated bytes) per
    hash bucket (65,536 buckets: 512 KB a split); each record goes to the shard whose range of
    the split's weight holds its place in hash order (plan.shard_indexes), and one GroupByKey
    gathers each (split, shard): the largest group is one shard's metadata. Every shard but the
    last is within part of a bucket's weight of `target_bytes` at each end (a bigger record is a
    shard of its own); with `max_records`, a record weighs at least target // max_records + 1
    bytes, so a shard of tiny images holds about `max_records`. `num_shards`: that many equal
    parts of the weight (at most one a record). An empty range makes no shard (shards are
    numbered again when written).
    """

    def __init__(
        self, seed: int, target_bytes: int | None, num_shards: int | None, max_records: int | None = None
    ):
        super().__init__()
        if not target_bytes and not num_shards:
            raise ValueError("PlanShards needs target_bytes or num_shards")
        self._seed, self._target, self._num = seed, target_bytes, num_shards
        self._floor = 0 if num_shards else weight_floor(target_bytes, max_records)

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[ShardTask]:
        # The batches AssignSplits hashed keep their hashes: computed here only if they lack them.
        hashed = records | "HashRecords" >> beam.Map(with_hashes, self._seed).with_output_types(RecordBatch)
        totals = pvalue.AsSingleton(
            hashed
            | "Totals" >> beam.CombineGlobally(SumPerKeyFn(split_weights, self._floor)).without_defaults(),
            default_value={},
        )  # {(split, RECORDS): int, (split, WEIGHTS): 65,536 int64}
        keys = KeyShardsFn(None if self._num else self._target, self._num)
        return (
            hashed
            | "KeyShards" >> beam.ParDo(keys, totals).with_output_types(KeyedBatch)
            | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [RecordBatch]): one shard's metadata
            | "CutShards"
            >> beam.ParDo(CutShardsFn(f"{self.label}/GroupByShard")).with_output_types(ShardTask)
        )
