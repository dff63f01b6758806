"""Helpers for records that travel in batches (FileBatch, RecordBatch; see transforms/records.py)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.combiners import CountCombineFn
from apache_beam.transforms.window import GlobalWindows

from transforms.records import BATCH_SIZE, FileBatch, RecordBatch

T = TypeVar("T")

# Distribution metrics of the records (images, rows) in each group of our GroupByKeys, named
# after the step: a run reports the largest group (benchmarks/scale.py, tests).
GROUP_SIZE_NAMESPACE = "img2tfrecord.group_size"


def group_size(step: str):  # -> apache_beam.metrics.metricbase.Distribution
    """The distribution metric of the group sizes of our GroupByKey `step`."""
    return Metrics.distribution(GROUP_SIZE_NAMESPACE, step)


def chunked(items: Iterable[T], size: int = BATCH_SIZE) -> Iterator[tuple[T, ...]]:
    """`items` in order, as tuples of up to `size` (never an empty one)."""
    it = iter(items)
    while chunk := tuple(itertools.islice(it, size)):
        yield chunk


def images_in(element: object) -> int:
    """The images an element stands for: a batch its length, anything else (a Failure) one."""
    return len(element) if isinstance(element, (FileBatch, RecordBatch)) else 1


class CountImagesFn(CountCombineFn):
    """Counts images in batches and single elements (images_in): a lifted count."""

    def add_input(self, count: int, element: object) -> int:
        return count + images_in(element)

    def add_inputs(self, count: int, elements: Iterable[object]) -> int:
        return count + sum(map(images_in, elements))


class SumPerKeyFn(beam.CombineFn):
    """Elements -> {key: sum}, where `pairs(element, *args)` gives an element's (key, value)
    pairs (ints, or numpy arrays added elementwise): a lifted combiner, one small dict a
    bundle. Bounded by what its callers key on (a class, a split, a hash bucket)."""

    def __init__(self, pairs: Callable[..., Iterable[tuple[Any, Any]]], *args: Any):
        self._pairs, self._args = pairs, args

    def create_accumulator(self) -> dict:
        return {}

    @staticmethod
    def _summed(acc: dict, pairs: Iterable[tuple[Any, Any]]) -> dict:
        get = acc.get
        for key, n in pairs:
            acc[key] = get(key, 0) + n
        return acc

    def add_input(self, acc: dict, element: Any) -> dict:
        return self._summed(acc, self._pairs(element, *self._args))

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        it = iter(accs)
        return functools.reduce(lambda merged, acc: self._summed(merged, acc.items()), it, next(it, {}))

    def extract_output(self, acc: dict) -> dict:
        return acc


class RebatchFn(beam.DoFn):
    """Base of DoFns whose main output is batched again after per-image work: `process` yields
    what `self.batched(item)` returns for each item (a full batch every BATCH_SIZE items), and
    `finish_bundle` the rest (subclasses that define start_bundle or finish_bundle call these).
    """

    make_batch: Callable[[tuple], Any] = RecordBatch

    def start_bundle(self) -> None:
        self._pending: list = []

    def batched(self, item: object) -> Iterator:
        self._pending.append(item)
        if len(self._pending) >= BATCH_SIZE:
            yield self._take()

    def finish_bundle(self) -> Iterator:
        if self._pending:
            yield GlobalWindows.windowed_value(self._take())

    def _take(self) -> Any:
        batch, self._pending = type(self).make_batch(tuple(self._pending)), []
        return batch


class KeyedGather:
    """RecordBatches with a key per record, held over a bundle and sent as (key, RecordBatch)
    parts: one part per key each time the held records are flushed.

    A flush (when `max_held` records are held, and at the end of the bundle: `drain`) joins
    the held batches once, orders their records by key with one stable numpy sort of int
    codes, and cuts that into one RecordBatch per key: a few C gathers a record, whatever the
    number of keys, and one shuffled element per key a flush. A DoFn holds at most `max_held`
    records (plus the batch being added); a key's records keep their order of arrival.
    """

    def __init__(self, max_held: int = 50 * BATCH_SIZE):
        self._batches: list[RecordBatch] = []
        self._codes: list[np.ndarray] = []
        self._keys: dict = {}
        self._held = 0
        self._max_held = max_held

    def add_coded(
        self, batch: RecordBatch, codes: np.ndarray, keys: Sequence[Any]
    ) -> Iterator[tuple[Any, RecordBatch]]:
        """Holds `batch`, whose record i goes under keys[codes[i]]; yields a flush's parts when one is due.

        The keys are looked up once per distinct key of the batch, not once per record (a
        dict lookup of a tuple key a record cost about as much as the rest of the keying).
        """
        code = self._keys.setdefault
        mapping = np.fromiter((code(k, len(self._keys)) for k in keys), np.int64, len(keys))
        self._codes.append(mapping[codes] if len(codes) else codes.astype(np.int64))
        self._batches.append(batch)
        self._held += len(batch)
        if self._held >= self._max_held:
            yield from self.drain()

    def drain(self) -> Iterator[tuple[Any, RecordBatch]]:
        """Every held record, one part per key, keys in the order they were first added (stable for a bundle)."""
        if not self._batches:
            return
        batch, codes, names = RecordBatch.concat(self._batches), np.concatenate(self._codes), list(self._keys)
        self._batches, self._codes, self._keys, self._held = [], [], {}, 0
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        if codes[0] == codes[-1]:  # one key: the batch as it is
            yield names[codes[0]], batch
            return
        ordered = batch.take(order.tolist())
        cuts_at = [0, *(np.flatnonzero(np.diff(codes)) + 1).tolist(), len(codes)]
        for start, stop in zip(cuts_at, cuts_at[1:]):
            yield names[codes[start]], ordered.slice(start, stop)
