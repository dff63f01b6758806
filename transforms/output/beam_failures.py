"""The Beam shells of failures.jsonl: counts from a combiner, and sorted parts written per group.

In: Failure. Out: FailureCounts (a combiner: one small dict), parts of at most PART_SIZE
failures (one GroupByKey group a part), merged line by line by FinalizeFn.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam

from transforms.batching import group_size
from transforms.failures import Failure
from transforms.output.failure_log import (
    FailureCounts,
    count_failure,
    counts_of,
    merge_counts,
    new_counts,
    write_part,
)


class FailureCountsFn(beam.CombineFn):
    """Failures -> FailureCounts (lifted: one small accumulator per bundle; bounded by the
    number of stages, classes and MAX_KINDS reason kinds)."""

    def create_accumulator(self) -> list:
        return new_counts()

    def add_input(self, acc: list, f: Failure) -> list:
        return count_failure(acc, f)

    def merge_accumulators(self, accs: Iterable[list]) -> list:
        return merge_counts(accs)

    def extract_output(self, acc: list) -> FailureCounts:
        return counts_of(acc)


class WriteFailurePartsFn(beam.DoFn):
    """(part, [Failure]) -> the part file's path. The group is one part (~PART_SIZE failures)."""

    def __init__(self, staging: str, step: str):
        self._staging = staging
        self._sizes = group_size(step)

    def process(self, element: tuple[int, Iterable[Failure]]) -> Iterator[str]:
        part, failures = element
        failures = list(failures)
        self._sizes.update(len(failures))
        yield write_part(self._staging, part, failures)
