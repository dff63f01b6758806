"""failures.jsonl without one list of every failure: counts, sorted parts, a streamed merge.

Failures (transforms/failures.py) flow in from every stage. Two things flow out:

- FailureCounts, from a combiner: the failed count by stage and by (split, class), which is
  all summary.json needs. Bounded by the stages and the classes, like the listed counts.
- Sorted part files: failures are keyed by a hash of their path into ceil(failed / 10,000)
  buckets (the count as a side input), each bucket (a group of ~10,000 failures: the only
  group here) is sorted by (path, stage) and written as one part file in the run's staging
  folder; only the part paths come back.

FinalizeFn then merges the parts into failures.jsonl line by line (`merge_parts`, a k-way
merge holding one line per part), so the file is sorted by (path, stage) as a whole, the
same on every runner, and no worker holds more than one bucket of failures.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
from collections.abc import Iterable, Iterator

from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.failures import Failure, reason_kind
from transforms.layout.plan import hash64

# Failures per part file (and per group): a few MB of JSON lines.
PART_SIZE = 10_000


# Reason kinds counted apart for the exit-3 line; more distinct kinds are counted together.
MAX_KINDS = 1_000


OTHER_KINDS = "other reasons"


_PARTS_DIR = "failure-parts"


_WRITE_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class FailureCounts:
    """What summary.json counts of the failures.

    Attributes:
      failed: every failure.
      by_stage: ((stage, n), ...) sorted.
      by_class: (((split, class_key), n), ...) sorted, for failures with a split.
      by_kind: ((reason kind, n), ...) sorted (failures.reason_kind, for the exit-3 line):
        at most MAX_KINDS kinds, the rest counted as OTHER_KINDS.
    """

    failed: int = 0
    by_stage: tuple[tuple[str, int], ...] = ()
    by_class: tuple[tuple[tuple[str, str], int], ...] = ()
    by_kind: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, failures: Iterable[Failure]) -> FailureCounts:
        """The counts of `failures` (for tests and small inputs)."""
        acc = new_counts()
        for f in failures:
            count_failure(acc, f)
        return counts_of(acc)


def _add_kind(kinds: dict, kind: str, n: int) -> None:
    if kind not in kinds and len(kinds) >= MAX_KINDS:
        kind = OTHER_KINDS
    kinds[kind] = kinds.get(kind, 0) + n


def new_counts() -> list:
    """An empty accumulator of FailureCounts: [failed, by stage, by (split, class), by reason kind]."""
    return [0, {}, {}, {}]


def count_failure(acc: list, f: Failure) -> list:
    """`acc` with one more failure `f`."""
    acc[0] += 1
    acc[1][f.stage] = acc[1].get(f.stage, 0) + 1
    if f.split is not None:
        key = (f.split, f.class_key or "")
        acc[2][key] = acc[2].get(key, 0) + 1
    _add_kind(acc[3], reason_kind(f.reason), 1)
    return acc


def merge_counts(accs: Iterable[list]) -> list:
    """One accumulator of several."""
    merged = new_counts()
    for failed, stages, classes, kinds in accs:
        merged[0] += failed
        for k, n in stages.items():
            merged[1][k] = merged[1].get(k, 0) + n
        for k, n in classes.items():
            merged[2][k] = merged[2].get(k, 0) + n
        for k, n in kinds.items():
            _add_kind(merged[3], k, n)
    return merged


def counts_of(acc: list) -> FailureCounts:
    """The FailureCounts of an accumulator."""
    return FailureCounts(
        acc[0], tuple(sorted(acc[1].items())), tuple(sorted(acc[2].items())), tuple(sorted(acc[3].items()))
    )


def failure_line(f: Failure) -> str:
    return f.to_json() + "\n"


def line_order(f: Failure) -> tuple[str, str, str]:
    """The order of failures.jsonl: path, stage, then the line itself (ties are identical lines)."""
    return f.path, f.stage, failure_line(f)


def part_of(f: Failure, failed: int) -> int:
    """The part (bucket) of a failure: a hash of its path, PART_SIZE failures a part on average."""
    parts = max(1, math.ceil(failed / PART_SIZE))
    return hash64("failures", f.path) % parts


def part_path(staging: str, part: int) -> str:
    return FileSystems.join(staging, _PARTS_DIR, f"part-{part:06d}.jsonl")


def _write_lines(path: str, lines: Iterable[str]) -> None:
    """Streams `lines` (each ending in a newline) into `path` as UTF-8, ~1 MB a write."""
    with gcs.create(path, mime_type="text/plain") as out:
        chunk: list[str] = []
        held = 0
        for line in lines:
            chunk.append(line)
            held += len(line)
            if held >= _WRITE_CHUNK:
                out.write("".join(chunk).encode("utf-8"))
                chunk, held = [], 0
        out.write("".join(chunk).encode("utf-8"))


def write_part(staging: str, part: int, failures: Iterable[Failure]) -> str:
    """Writes one part, sorted by line_order; returns its path (rewritten whole on a retry)."""
    path = part_path(staging, part)
    _write_lines(path, (line for _, _, line in sorted(map(line_order, failures))))
    return path


def _lines(path: str) -> Iterator[str]:
    with gcs.open_read(path, mime_type="text/plain") as f:
        for raw in f:
            yield raw.decode("utf-8")


def _line_key(line: str) -> tuple[str, str, str]:
    d = json.loads(line)
    return d["path"], d["stage"], line


def merge_parts(parts: Iterable[str], dest: str) -> None:
    """Merges sorted part files into `dest`, in line_order; one line held per part."""
    streams = [_lines(p) for p in sorted(parts)]
    _write_lines(dest, heapq.merge(*streams, key=_line_key))
