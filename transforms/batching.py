"""Helpers for records that travel in batches (FileBatch, RecordBatch; see transforms/records.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms.records import BATCH_SIZE, FileBatch, ImageRecord, RecordBatch

T = TypeVar("T")


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


def records_of(batches: Iterable[RecordBatch]) -> Iterator[ImageRecord]:
    """The records of `batches`, in order."""
    return itertools.chain.from_iterable(b.records for b in batches)


def key_batch(batch: RecordBatch, key: Callable[[ImageRecord], str]) -> list[tuple[str, RecordBatch]]:
    """`batch` cut by `key` into one (key, RecordBatch) per distinct key, records in order.

    A batch whose records all share one key (a single split, say) is passed on as it is.
    """
    keys = [key(r) for r in batch.records]
    if all(k == keys[0] for k in keys):
        return [(keys[0], batch)] if keys else []
    groups: dict[str, list[ImageRecord]] = {}
    for k, record in zip(keys, batch.records):
        groups.setdefault(k, []).append(record)
    return [(k, RecordBatch(tuple(records))) for k, records in groups.items()]
