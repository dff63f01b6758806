"""Dataset layout: split assignment, a deterministic global shuffle and shard planning.

RecordBatches of ImageRecord metadata in (transforms/records.py); RecordBatches with each
record's split set (AssignSplits) and ShardTasks, one shard's records in write order
(PlanShards), out. No image bytes are read here.

The shuffle is a sort by a seeded hash of each image's relative path, so the same input
and seed give the same shards on any runner and with any number of workers, and classes
are mixed inside every shard. Neither a split nor a class is ever gathered on one worker:
shard boundaries are found from totals and per-bucket counts of that hash order
(transforms/layout/cuts.py, beam_cuts.py), a class's split boundaries inside bounded groups
(strata.py, beam_strata.py), and the only groups are one shard's records, one hash bucket
that straddles a shard boundary, or (--stratify) a pack of small classes of at most 512
records or one hash bucket of a bigger class. Every group's size goes to a Beam distribution
metric (batching.group_size).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import group_size
from transforms.layout import cuts
from transforms.layout.beam_cuts import (
    SHUFFLE_HASH,
    SPLIT_HASH,
    CutOrder,
    Located,
    Order,
    splits_of,
)
from transforms.layout.beam_strata import CutClasses
from transforms.layout.plan import (
    _FINE_BITS,
    DEFAULT_SEED,
    _cumulative,
    _shard_layout,
    planning_weights,
    split_indexes,
    weight_floor,
    with_hashes,
)
from transforms.records import BATCH_SIZE, RecordBatch, ShardTask


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
    ints for GLDv2), and every record is placed in one group (CutClasses): a pack of small
    classes of at most 512 records in all, or one hash bucket of 256-512 records of a larger
    class (a bucket table of one entry per bucket). RecordBatches in, RecordBatches out.
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
                split_hashes = cuts.hash_columns(with_hashes(batch, seed).hashes)[SPLIT_HASH]
                return batch.with_columns(
                    splits=tuple([names[i] for i in split_indexes(split_hashes, ratios)])
                )

            return hashed | "HashSplit" >> beam.Map(hash_split).with_output_types(RecordBatch)

        return (
            hashed
            | "CutClasses"
            >> CutClasses(
                seed, _cumulative(ratios), f"{self.label}/CutClasses"
            )  # (split indexes, RecordBatch)
            | "SetSplits" >> beam.ParDo(SetSplitsFn(names)).with_output_types(RecordBatch)
        )


class CutShardsFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> ShardTask: one shard's records in shuffled order."""

    def __init__(self, seed: int, step: str):
        self._seed = seed
        self._sizes = group_size(step)

    def process(self, element: tuple[tuple[str, int], Iterable[RecordBatch]]) -> Iterator[ShardTask]:
        (split, index), batches = element
        batch = with_hashes(RecordBatch.concat(batches), self._seed)
        keys = list(zip(cuts.hash_columns(batch.hashes)[SHUFFLE_HASH].tolist(), batch.relpaths, batch.paths))
        order = sorted(range(len(batch)), key=keys.__getitem__)
        self._sizes.update(len(order))
        yield ShardTask(split, index, batch.take(order))


class PlanShards(beam.PTransform):
    """Cuts each split, in a seeded shuffled order, into ShardTasks without gathering a split.

    The shards are those of `plan_shards` on the whole split. Totals per split (count,
    estimated bytes) give the shard count and a hash-bucket resolution of about 8 buckets a
    shard (capped at 2**16 buckets a split: the totals and the bucket counts come from one
    pass over the records, a 16-bit histogram a split coarsened to those bits, so past
    8,192 shards a split a bucket is 1/65,536 of it); the bucket table's prefix sums place every bucket that lies inside one shard,
    and a straddling bucket is grouped and sorted to give the exact boundaries inside it (CutOrder).
    Then one group per (split, shard): the largest group is one shard's metadata
    (ImageRecords, a few hundred bytes each), whatever the number of images.

    With `target_bytes` every shard but the last is within one record of the target at any
    shard size (so within 10% once a shard holds more than ~10 images of similar size; a
    single image larger than the target makes a shard of its own), and the last is at most
    one record over it. With `max_records` too, no shard holds more than that many records:
    a record weighs at least target // max_records + 1 bytes in the plan (plan.weight_floor),
    so a shard of images smaller than that holds up to `max_records` of them and fewer bytes
    than the target. That bounds the largest group (and what a writer holds) by a number of
    records, whatever the image sizes. With `num_shards`, exactly that many shards unless
    one image weighs more than a shard (or there are fewer images than shards); no cap.
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
        self._seed, self._target, self._num = seed, target_bytes, num_shards
        self._floor = 0 if num_shards else weight_floor(target_bytes, max_records)

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[ShardTask]:
        seed = self._seed
        order = Order(
            seed=seed,
            segments=splits_of,
            hash_column=SHUFFLE_HASH,
            weights=planning_weights(self._floor),
            layout=_shard_layout(self._target, self._num),
            fine_bits=_FINE_BITS,
        )
        return (
            records
            | "HashRecords" >> HashRecords(seed)  # the same batches where AssignSplits hashed them
            | "CutSplits"
            >> CutOrder(order, f"{self.label}/CutSplits")  # ((split, shard), RecordBatch): a shard in parts
            | "GroupByShard" >> beam.GroupByKey()  # ((split, shard), [RecordBatch]): one shard's metadata
            | "CutShards"
            >> beam.ParDo(CutShardsFn(seed, f"{self.label}/GroupByShard")).with_output_types(ShardTask)
        )
