"""The files of a folder-of-annotations format (pure): listing and bounded reads.

In: what `--labels` names for VOC, YOLO and segmentation maps: a local folder (walked as the
image listing walks one: transforms/listing/local.py, hidden entries skipped), a glob, or a
gs:// prefix or glob (Beam's FileSystems.match). Out: the paths of the files with the
format's suffix, sorted, and each file's bytes (at most a format's limit).
"""

from __future__ import annotations

import itertools
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.failures import user_error_text
from transforms.labels.annotations.rows import AnnotationError, RowBuilder
from transforms.labels.table import normalize_key
from transforms.listing.local import is_listed, walk_local
from transforms.records import BATCH_SIZE


def _has_suffix(path: str, suffixes: tuple[str, ...]) -> bool:
    return posixpath.splitext(path)[1].lower() in suffixes


def _pattern(location: str) -> str:
    """Beam's match pattern for a glob, a file, or a folder or prefix (all below it)."""
    if any(c in location for c in "*?["):
        return location
    if "://" in location and not gcs.exists(location):
        return location.rstrip("/") + "/**"
    return gcs.literal_or_glob(location)


def list_files(location: str, suffixes: tuple[str, ...], limit: int | None = None) -> Iterator[str]:
    """The paths of the files below `location` whose suffix is one of `suffixes` (lower case),
    sorted; at most `limit` of them (None: all).

    A local folder is walked as the image listing walks one (a folder's entries at a time,
    hidden ones skipped, sorted depth first); a glob or gs://
    prefix is matched by Beam, which holds the matched paths (their metadata) in one list.
    Raises AnnotationError: nothing there, or it cannot be listed.
    """
    if "://" not in location and os.path.isdir(location):
        try:
            yield from (f.path for f in itertools.islice(walk_local(location, suffixes), limit))
        except ValueError as e:  # a folder that cannot be listed
            raise AnnotationError(user_error_text(str(e)) or str(e)) from None
        return
    try:
        found = FileSystems.match([_pattern(location)], limits=[limit] if limit else None)[0].metadata_list
    except (BeamIOError, OSError, ValueError) as e:
        raise AnnotationError(f"--labels {location}: cannot list: {str(e).splitlines()[0]}") from None
    root = location.split("*", 1)[0]
    for path in sorted(m.path for m in found):
        if _has_suffix(path, suffixes) and is_listed(path[len(root) :].lstrip("/")):
            yield path


def read_bounded(path: str, limit: int) -> bytes:
    """The bytes of `path`, or its first limit + 1 bytes when it is larger (the caller names
    that as a failure). Raises OSError if it cannot be read."""
    with gcs.open_read(path) as f:
        return f.read(limit + 1)


def rows_of_files(
    paths: Iterable[str],
    parse: Callable[[RowBuilder, bytes, str], None],
    limit: int,
    *,
    prefix: bool = False,
    normalized: bool = False,
    key_of: Callable[[str], str | None] = lambda path: None,
    size: int = BATCH_SIZE,
) -> Iterator[pa.RecordBatch]:
    """The rows of annotation files, one file read whole at a time (at most `limit` bytes;
    with `prefix`, only its first `limit` bytes: a header), in batches of up to `size` rows:
    parse(rows, data, path) adds a file's rows. A file that cannot be read, or is over
    `limit` bytes, is a failure row keyed by key_of(path)."""
    rows = RowBuilder(normalized=normalized, size=size)
    for path in paths:
        try:
            data = read_bounded(path, limit)
        except OSError as e:
            rows.fail(key_of(path), 0, f"cannot read: {e.strerror or e}", source=path)
        else:
            if len(data) > limit and not prefix:
                rows.fail(key_of(path), 0, f"larger than {limit:,} bytes", source=path)
            else:
                parse(rows, data, path)
        yield from rows.batches()
    yield from rows.flush()


def stem_key(path: str) -> str:
    """The key of an annotation file named after its image's stem (YOLO, segmentation maps)."""
    return normalize_key(posixpath.splitext(path.rsplit("/", 1)[-1])[0])
