"""Helpers for records that travel in batches (FileBatch, RecordBatch; see transforms/records.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.records import BATCH_SIZE, FileBatch, ImageRecord, RecordBatch

T = TypeVar("T")

# Beam distribution metrics named after our GroupByKeys: the records (images, rows) of each
# group, so a run can report the largest group any of them saw (benchmarks/scale.py, tests).
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


class CountImagesFn(beam.CombineFn):
    """Counts images in batches and single elements (images_in): a lifted count, as CountCombineFn."""

    def create_accumulator(self) -> int:
        return 0

    def add_input(self, count: int, element: object) -> int:
        return count + images_in(element)

    def merge_accumulators(self, counts: Iterable[int]) -> int:
        return sum(counts)

    def extract_output(self, count: int) -> int:
        return count


class RebatchFn(beam.DoFn):
    """Base of DoFns whose main output is batched again after per-image work.

    `process` passes each output item to `self.batched(item)` and yields what it returns:
    a full batch every `BATCH_SIZE` items. The bundle's remainder is emitted in
    `finish_bundle` (global window: the whole pipeline is batch). Subclasses that define
    `start_bundle` or `finish_bundle` call these.
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


def key_batch(batch: RecordBatch, key: Callable[[ImageRecord], str]) -> list[tuple[str, RecordBatch]]:
    """`batch` cut by `key` into one (key, RecordBatch) per distinct key, records in order.

    A batch whose records all share one key (a single split, say) is passed on as it is.
    """
    keys = [key(r) for r in batch.records]
    if all(k == keys[0] for k in keys):
        return [(keys[0], batch)] if keys else []
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return [(k, batch.take(indices)) for k, indices in groups.items()]


class BatchGather:
    """RecordBatches gathered per key over a bundle, sent as (key, RecordBatch) parts.

    A key's part is sent when it holds BATCH_SIZE records or more, or at the end of the
    bundle, or all parts at once when `max_held` records are held: the shuffle moves about
    one element per BATCH_SIZE records whatever the key count, and a DoFn holds at most
    `max_held` records (plus the batch being added).
    """

    def __init__(self, max_held: int = 50 * BATCH_SIZE):
        self._parts: dict = {}
        self._counts: dict = {}
        self._held = 0
        self._max_held = max_held

    def add(self, key: Any, batch: RecordBatch) -> Iterator[tuple[Any, RecordBatch]]:
        """Adds `batch` under `key`; yields the parts that are due."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = []
        parts.append(batch)
        count = self._counts[key] = self._counts.get(key, 0) + len(batch)
        self._held += len(batch)
        if count >= BATCH_SIZE:
            yield self._take(key)
        elif self._held >= self._max_held:
            yield from self.drain()

    def drain(self) -> Iterator[tuple[Any, RecordBatch]]:
        """Every held part, in key order (a stable order for the same bundle)."""
        for key in sorted(self._parts):
            yield self._take(key)

    def _take(self, key: Any) -> tuple[Any, RecordBatch]:
        parts = self._parts.pop(key)
        self._held -= self._counts.pop(key)
        return key, RecordBatch.concat(parts)
