"""Live progress of a local run: a process-local tally that the pipeline's DoFns update.

`main.run` registers a Progress under the run id and polls it (beam_pipeline/cli/progress.py).
DoFns look the tally up by that id where they run: in-process they find it; in a worker
process of another runner (Dataflow, multi_processing) they find nothing and only the Beam
counters count, which is what the Dataflow UI shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import apache_beam as beam
from apache_beam.metrics import Metrics


class Progress:
    """Thread-safe counts of one run: listed, written and failed images, bytes written;
    `first_done`: when the first image was written or failed (rates start there)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.listed = self.written = self.failed = self.bytes = 0
        self.first_done: float | None = None

    def add(self, *, listed: int = 0, written: int = 0, failed: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.listed += listed
            self.written += written
            self.failed += failed
            self.bytes += nbytes
            if self.first_done is None and (written or failed):
                self.first_done = time.monotonic()

    def snapshot(self) -> tuple[int, int, int, int, float | None]:
        """(listed, written, failed, bytes, first_done), read together."""
        with self._lock:
            return self.listed, self.written, self.failed, self.bytes, self.first_done


_REGISTRY: dict[str, Progress] = {}  # run id -> its tally (one dict call each: thread-safe)


def register(key: str) -> Progress:
    """Creates and registers the tally of run `key` in this process."""
    progress = _REGISTRY[key] = Progress()
    return progress


def unregister(key: str) -> None:
    _REGISTRY.pop(key, None)


def lookup(key: str | None) -> Progress | None:
    """The tally of run `key` if it lives in this process, else None."""
    return _REGISTRY.get(key) if key else None


# What CountProgress counts.
LISTED = "listed"
FAILED_ANYWHERE = "failed"


class CountProgressFn(beam.DoFn):
    """Counts elements as `what` in this run's tally (if it lives here) and a Beam counter."""

    def __init__(self, key: str | None, what: str):
        self._key, self._what = key, what
        self._counter = Metrics.counter(self.__class__, f"images_{what}")

    def setup(self) -> None:
        self._progress = lookup(self._key)

    def process(self, element: object) -> Iterable[None]:
        self._counter.inc()
        if self._progress is not None:
            self._progress.add(**{self._what: 1})
        return ()


class CountProgress(beam.PTransform):
    """Counts a PCollection's elements as `what` (LISTED or FAILED_ANYWHERE); outputs nothing."""

    def __init__(self, key: str | None, what: str):
        super().__init__()
        if what not in (LISTED, FAILED_ANYWHERE):
            raise ValueError(f"cannot count {what!r}")
        self._fn = CountProgressFn(key, what)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection[None]:
        return pcoll | beam.ParDo(self._fn)
