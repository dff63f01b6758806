"""Per-shard index files (`<shard>.idx`) for NVIDIA DALI and the PyTorch `tfrecord` package.

The format is that of DALI's `tfrecord2idx` tool (and `tfrecord.tools.tfrecord2idx`): one
`offset length` line per record, where `length` counts the whole framed record (header,
data and CRC). The writer knows each record's size, so the index is built while writing and
renamed next to its shard at finalize time. Only uncompressed shards can be indexed.
"""

from __future__ import annotations

from collections.abc import Iterable

from transforms.encoding.tfrecord import RECORD_OVERHEAD
from transforms.writing.files import write_text

INDEX_SUFFIX = ".idx"


def index_text(record_sizes: Iterable[int]) -> str:
    """The index of a shard whose records hold `record_sizes` data bytes, in order."""
    lines, offset = [], 0
    for size in record_sizes:
        framed = size + RECORD_OVERHEAD
        lines.append(f"{offset} {framed}\n")
        offset += framed
    return "".join(lines)


def parse_index(text: str) -> list[tuple[int, int]]:
    """(offset, length) pairs of an index file's text."""
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line.strip())]


def index_path(shard_path: str) -> str:
    return shard_path + INDEX_SUFFIX


def write_index(shard_path: str, record_sizes: Iterable[int]) -> str:
    """Writes `<shard_path>.idx`; returns its path."""
    path = index_path(shard_path)
    write_text(path, index_text(record_sizes))  # ASCII digits and spaces
    return path
