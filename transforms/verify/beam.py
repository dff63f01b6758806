"""verify as a Beam pipeline: one shard per element, the checks of shards.py on workers.

In: shard paths. Out: ShardCheck per shard (its records, classes, first problem).
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.encoding.dataset_format import DatasetFormat
from transforms.verify.shards import ShardCheck, check_shard


class CheckShardFn(beam.DoFn):
    """shard path -> ShardCheck (without image samples)."""

    def __init__(self, fmt: DatasetFormat, class_names: list[str], offset: int, decode_all: bool):
        self._fmt, self._names, self._offset = fmt, class_names, offset
        self._decode_all = decode_all
        self._records = Metrics.counter(self.__class__, "records_checked")
        self._bad = Metrics.counter(self.__class__, "bad_shards")

    def process(self, path: str) -> Iterable[ShardCheck]:
        result = check_shard(path, self._fmt, self._names, self._offset, decode_all=self._decode_all)
        self._records.inc(result.records)
        if not result.ok:
            self._bad.inc()
        yield result


class VerifyShards(beam.PTransform):
    """Checks each shard path in parallel: PCollection[str] -> PCollection[ShardCheck]. No side
    input (the format and class names are configuration), no group but the Reshuffle of paths."""

    def __init__(self, fmt: DatasetFormat, class_names: list[str], offset: int = 0, decode_all: bool = False):
        super().__init__()
        self._fn = CheckShardFn(fmt, list(class_names), offset, decode_all)

    def expand(self, paths: beam.PCollection[str]) -> beam.PCollection[ShardCheck]:
        return (
            paths
            | "Reshuffle" >> beam.Reshuffle()  # spread shards over workers
            | "CheckShard" >> beam.ParDo(self._fn)
        )
