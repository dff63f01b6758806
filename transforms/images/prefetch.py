"""Ordered parallel map for the per-image work inside one shard.

A shard is written in its planned order by one DoFn call, so Beam alone cannot spread it over
cores. Reading and decoding release the GIL, so threads that read and check the next images
while the DoFn writes the current one keep every core busy. At most `ahead` results are held
at a time (`Executor.map` would submit every item at once), so memory stays bounded.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_threads() -> int:
    """Threads per DoFn instance when not configured: one per core."""
    return os.cpu_count() or 1


def map_in_order(
    fn: Callable[[T], R],
    items: Iterable[T],
    pool: ThreadPoolExecutor | None,
    ahead: int = 8,
) -> Iterator[tuple[T, Callable[[], R]]]:
    """Yields `(item, result)` in input order; `result()` returns `fn(item)` or raises its error
    (the caller decides which are expected). With a pool, up to `ahead` calls run ahead of the
    consumer; without one, `fn` runs when `result()` is called, in the caller's thread."""
    if pool is None:
        for item in items:
            yield item, (lambda item=item: fn(item))
        return
    pending: collections.deque = collections.deque()
    iterator = iter(items)
    try:
        for item in iterator:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= ahead:
                done_item, future = pending.popleft()
                yield done_item, future.result
        while pending:
            done_item, future = pending.popleft()
            yield done_item, future.result
    finally:
        for _, future in pending:  # the consumer stopped early: drop what is queued
            future.cancel()
