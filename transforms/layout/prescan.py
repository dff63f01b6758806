"""Reads before the plan (pure): a file's content hash (--dedupe) and its stored size estimated
from its header (options that re-encode). In: ImageRecord. Out: (sha256, header), or the record
with its estimated size.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable

from transforms.failures import Failure
from transforms.images.convert import estimate_stored_size
from transforms.images.read import CHECK_ABOVE, HEADER_BYTES, HeaderCheck, open_source
from transforms.images.types import ImageOptions
from transforms.listing.archives import source_name
from transforms.records import ImageRecord

DEDUPE_STAGE = "dedupe"


def with_estimated_size(record: ImageRecord, header: bytes, options: ImageOptions) -> ImageRecord:
    """The record with `size` replaced by the estimated stored size."""
    return dataclasses.replace(record, size=estimate_stored_size(header, record.size, options))


def hash_and_header(path: str, check: HeaderCheck | None = None, size: int = 0) -> tuple[str, bytes]:
    """(hex sha256 of the file, its first HEADER_BYTES), reading the file in chunks.

    A file of more than CHECK_ABOVE bytes (`size`, as listed) is hashed only if
    `check(header, size)` accepts it; what it raises propagates before the rest is read.
    """
    digest = hashlib.sha256()
    with open_source(path) as f:
        header = f.read(HEADER_BYTES)
        if check is not None and size > CHECK_ABOVE:
            check(header, size)
        digest.update(header)
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), header


def estimated(record: ImageRecord, options: ImageOptions) -> ImageRecord:
    """The record with its estimated stored size; as it is if its file cannot be read (reported
    by WriteShards when it reads the file)."""
    try:
        with open_source(record.path) as f:
            header = f.read(HEADER_BYTES)
    except OSError:
        return record
    return with_estimated_size(record, header, options)


def split_duplicates(records: Iterable[ImageRecord]) -> tuple[ImageRecord, list[Failure]]:
    """The record kept among same-content records (smallest relpath), and the others."""
    kept, *others = sorted(records, key=lambda r: (r.relpath, r.path))
    reason = f"duplicate of {source_name(kept.path, kept.relpath)}"
    return kept, [Failure(r.path, reason, DEDUPE_STAGE, r.split, r.class_key) for r in others]
