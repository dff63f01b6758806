"""The listing DoFns of local folders and of other filesystems' matches, and their bases.
In: an impulse (a local root) or Beam's FileMetadata. Out: FileBatch of ImageFile; ARCHIVES:
ArchiveFile; SKIPPED: the counts of what was not read (skips.py), one small dict a bundle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystem import FileMetadata
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.batching import RebatchFn
from transforms.listing.archives import ArchiveFile, archive_kind
from transforms.listing.local import archive_in, hidden_entry, walk_local
from transforms.listing.skips import SkipCounts
from transforms.paths import has_image_extension, relative_path
from transforms.progress import LISTED, Progress, lookup
from transforms.records import FileBatch, ImageFile

# Tagged outputs of the listing DoFns: the archives they found (ArchiveFile), and the counts
# of what they did not read ({(reason, extension): n}, skips.py), one a bundle.
ARCHIVES = "archives"
SKIPPED = "skipped"


class _ListFn(beam.DoFn):
    """Base of the listing DoFns: counts what they list as `images_listed` and in the
    run's Progress (`progress_key`, see transforms/progress.py), and what they pass over
    in `self.skips`, sent as SKIPPED when the bundle finishes (`skipped_output`)."""

    def __init__(self, progress_key: str | None):
        self._progress_key = progress_key
        self._listed = Metrics.counter(self.__class__, f"images_{LISTED}")
        self._progress: Progress | None = None
        self.skips = SkipCounts()

    def setup(self) -> None:
        self._progress = lookup(self._progress_key)

    def start_bundle(self) -> None:
        super().start_bundle()
        self.skips = SkipCounts()

    def skipped_output(self) -> Iterator[pvalue.TaggedOutput]:
        """The bundle's SKIPPED counts (for finish_bundle), even none: every listing has one,
        so summary.json always has its "skipped" section (the combine has no default)."""
        yield pvalue.TaggedOutput(SKIPPED, GlobalWindows.windowed_value(self.skips.take()))

    def finish_bundle(self) -> Iterable:
        yield from self.skipped_output()

    def count(self, n: int) -> None:
        self._listed.inc(n)
        if self._progress is not None:
            self._progress.add(listed=n)

    def counted(self, batch: FileBatch) -> FileBatch:
        """`batch`, counted as listed."""
        self.count(len(batch))
        return batch


class _KeepFn(_ListFn, RebatchFn):
    """Base of the DoFns that see one file at a time: images leave in FileBatches, batched
    per bundle (a batch when full, the rest when the bundle finishes), archives as ARCHIVES."""

    make_batch = FileBatch

    def __init__(self, root: str, progress_key: str | None = None):
        super().__init__(progress_key)
        self._root = root

    def keep(self, path: str, size: int) -> Iterator[FileBatch | pvalue.TaggedOutput]:
        """The file at `path` below the root: an image, an archive, or nothing (hidden, other:
        counted in `skips`)."""
        relpath = relative_path(path, self._root)
        hidden = hidden_entry(relpath)
        if hidden is not None:
            self.skips.hidden(hidden)
        elif archive_kind(path) is not None:
            yield pvalue.TaggedOutput(ARCHIVES, archive_in(path, self._root, size))
        elif has_image_extension(path):
            yield from map(self.counted, self.batched(ImageFile(path=path, relpath=relpath, size=size)))
        else:
            self.skips.other(path)

    def finish_bundle(self) -> Iterable:
        for batch in RebatchFn.finish_bundle(self):
            self.counted(batch.value)
            yield batch
        yield from self.skipped_output()


class WalkLocalFn(_KeepFn):
    """(an impulse) -> FileBatches of every local file with an image extension below `root`,
    in walk order; ARCHIVES: each archive found (ArchiveFile)."""

    def process(self, _: bytes) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        for found in walk_local(self._root, archives=True, skips=self.skips):
            if isinstance(found, ArchiveFile):
                yield pvalue.TaggedOutput(ARCHIVES, found)
            else:
                yield from map(self.counted, self.batched(found))


class KeepImagesFn(_KeepFn):
    """Matched files (remote roots) -> FileBatches of the images that are not hidden; ARCHIVES."""

    def process(self, meta: FileMetadata) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        yield from self.keep(meta.path, meta.size_in_bytes)
