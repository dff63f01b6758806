"""failures.jsonl without one list of every failure: counts, sorted parts, a streamed merge.

Failures flow in from every stage. Out: FailureCounts (a combiner in beam.py; bounded by the
stages, the classes and MAX_KINDS), and part files: failures keyed by a hash of their path
into ceil(failed / PART_SIZE) buckets (the only group here), each sorted by (path, stage) and
written to the staging folder. `merge_parts` (a k-way merge, one line held per part) makes
failures.jsonl sorted as a whole, the same on every runner.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import json
import math
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.batching import chunked
from transforms.failures import Failure
from transforms.layout.plan import hash64

# Failures per part file (and per group): a few MB of JSON lines.
PART_SIZE = 10_000

# Reason kinds counted apart for the exit-3 line; more distinct kinds are counted together.
MAX_KINDS = 1_000
OTHER_KINDS = "other reasons"


@dataclasses.dataclass(frozen=True)
class FailureCounts:
    """What summary.json and the exit-3 line count of the failures: all of them, then sorted
    (key, n) pairs by stage, by (split, class_key) (failures with a split) and by reason kind
    (failures.reason_kind: at most MAX_KINDS kinds, the rest as OTHER_KINDS)."""

    failed: int = 0
    by_stage: tuple[tuple[str, int], ...] = ()
    by_class: tuple[tuple[tuple[str, str], int], ...] = ()
    by_kind: tuple[tuple[str, int], ...] = ()


def add_kinds(kinds: collections.Counter, more: Iterable[tuple[str, int]]) -> None:
    """Adds (reason kind, n) pairs to `kinds`, at most MAX_KINDS kinds apart."""
    for kind, n in more:
        kinds[kind if kind in kinds or len(kinds) < MAX_KINDS else OTHER_KINDS] += n


def _line_key(line: str) -> tuple[str, str, str]:
    """The order of failures.jsonl: path, stage, then the line itself (ties are identical lines)."""
    d = json.loads(line)
    return d["path"], d["stage"], line


def part_of(f: Failure, failed: int) -> int:
    """The part (bucket) of a failure: a hash of its path, PART_SIZE failures a part on average."""
    return hash64("failures", f.path) % max(1, math.ceil(failed / PART_SIZE))


def _write_lines(path: str, lines: Iterable[str]) -> None:
    """Streams `lines` (each ending in a newline) into `path` as UTF-8, a few thousand a write."""
    with gcs.create(path, mime_type="text/plain") as out:
        for chunk in chunked(lines, 4096):
            out.write("".join(chunk).encode("utf-8"))


def write_part(staging: str, part: int, failures: Iterable[Failure]) -> str:
    """Writes one part, sorted as failures.jsonl; returns its path (rewritten whole on a retry)."""
    path = FileSystems.join(staging, "failure-parts", f"part-{part:06d}.jsonl")
    _write_lines(path, sorted((f.to_json() + "\n" for f in failures), key=_line_key))
    return path


def merge_parts(parts: Iterable[str], dest: str) -> None:
    """Merges sorted part files into `dest`; one line held per part."""
    with contextlib.ExitStack() as files:
        streams = [files.enter_context(gcs.open_read(p, mime_type="text/plain")) for p in sorted(parts)]
        lines = ((raw.decode("utf-8") for raw in stream) for stream in streams)
        _write_lines(dest, heapq.merge(*lines, key=_line_key))
