"""Per-shard index files (`<shard>.idx`) for NVIDIA DALI and the PyTorch `tfrecord` package.

The format of DALI's `tfrecord2idx` tool: one `offset length` line per record, `length` counting
the whole framed record (header, data and CRC). Built from the record sizes the writer knows;
uncompressed shards only.
"""

from __future__ import annotations

from collections.abc import Iterable

from transforms.encoding.tfrecord import RECORD_OVERHEAD
from transforms.writing.files import write_text

INDEX_SUFFIX = ".idx"


def parse_index(text: str) -> list[tuple[int, int]]:
    """(offset, length) pairs of an index file's text."""
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line.strip())]


def index_path(shard_path: str) -> str:
    return shard_path + INDEX_SUFFIX


def write_index(shard_path: str, record_sizes: Iterable[int]) -> str:
    """Writes `<shard_path>.idx` for records of `record_sizes` data bytes, in order; returns its path."""
    lines, offset = [], 0
    for size in record_sizes:
        lines.append(f"{offset} {size + RECORD_OVERHEAD}\n")
        offset += size + RECORD_OVERHEAD
    path = index_path(shard_path)
    write_text(path, "".join(lines))
    return path
