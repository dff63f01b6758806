"""The listing DoFns of local folders and of other filesystems' matches, and their base (counts what they list).

In: an impulse (a local root) or Beam's FileMetadata. Out: FileBatch of ImageFile; ARCHIVES: ArchiveFile.
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystem import FileMetadata
from apache_beam.metrics import Metrics

from transforms.batching import RebatchFn, chunked
from transforms.listing.archives import ArchiveFile, archive_kind
from transforms.listing.local import archive_in, is_listed, walk_local
from transforms.paths import has_image_extension, relative_path
from transforms.progress import LISTED, Progress, lookup
from transforms.records import FileBatch, ImageFile

# Tagged output of the listing DoFns: the archives they found (ArchiveFile).
ARCHIVES = "archives"


class _ListFn(beam.DoFn):
    """Base of the listing DoFns: counts what they list as `images_listed` and in the
    run's Progress (`progress_key`, see transforms/progress.py)."""

    def __init__(self, progress_key: str | None):
        self._progress_key = progress_key
        self._listed = Metrics.counter(self.__class__, f"images_{LISTED}")
        self._progress: Progress | None = None

    def setup(self) -> None:
        self._progress = lookup(self._progress_key)

    def counted(self, batch: FileBatch) -> FileBatch:
        """`batch`, counted as listed."""
        self._listed.inc(len(batch))
        if self._progress is not None:
            self._progress.add(listed=len(batch))
        return batch


class WalkLocalFn(_ListFn):
    """(an impulse) -> FileBatches of every local file with an image extension below `root`,
    in walk order; ARCHIVES: each archive found (ArchiveFile)."""

    def __init__(self, root: str, extensions: tuple[str, ...], progress_key: str | None = None):
        super().__init__(progress_key)
        self._root, self._extensions = root, extensions

    def process(self, _: bytes) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        for found in chunked(walk_local(self._root, self._extensions, archives=True)):
            files = tuple(f for f in found if isinstance(f, ImageFile))
            for archive in found:
                if isinstance(archive, ArchiveFile):
                    yield pvalue.TaggedOutput(ARCHIVES, archive)
            if files:
                yield self.counted(FileBatch(files))


class KeepImagesFn(_ListFn, RebatchFn):
    """Matched files -> FileBatches of those with an image extension that are not hidden
    (remote roots; see is_hidden); ARCHIVES: each archive (ArchiveFile).

    Batched per bundle: a batch is emitted when full, the rest when the bundle finishes.
    """

    make_batch = FileBatch

    def __init__(self, root: str, extensions: tuple[str, ...], progress_key: str | None = None):
        super().__init__(progress_key)
        self._root, self._extensions = root, extensions

    def process(self, meta: FileMetadata) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        relpath = relative_path(meta.path, self._root)
        if not is_listed(relpath):
            return
        if archive_kind(meta.path) is not None:
            yield pvalue.TaggedOutput(ARCHIVES, archive_in(meta.path, self._root, meta.size_in_bytes))
        elif has_image_extension(meta.path, self._extensions):
            image = ImageFile(path=meta.path, relpath=relpath, size=meta.size_in_bytes)
            yield from map(self.counted, self.batched(image))

    def finish_bundle(self) -> Iterable:
        for batch in super().finish_bundle():
            self.counted(batch.value)
            yield batch
