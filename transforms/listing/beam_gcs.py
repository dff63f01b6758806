"""The Beam shell of the gs:// listing: ListGcsImages fans the prefixes out over workers.

In: a gs:// root. Out: GcsListing (FileBatches of images, ArchiveFiles of tar archives).
The pure listing (one level with a delimiter, a prefix listed whole, the fan-out rule and
what bounds each element) is in transforms/listing/gcs.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from transforms.batching import RebatchFn
from transforms.coders import FileBatchCoder  # noqa: F401 - registers the record coders
from transforms.gcs import ERRORS as LIST_ERRORS
from transforms.gcs import GCS_SCHEME, Lister, lister, split_gcs_path
from transforms.listing.archives import archive_kind
from transforms.listing.beam_walk import ARCHIVES, _ListFn
from transforms.listing.gcs import (
    BELOW,
    EXPAND,
    FANOUT_LEVELS,
    FANOUT_TARGET,
    OBJECT,
    _cannot_list,
    list_below,
    list_level,
)
from transforms.listing.local import archive_in, is_listed
from transforms.paths import has_image_extension, relative_path
from transforms.records import FileBatch, ImageFile


class _GcsListFn(_ListFn, RebatchFn):
    """Base of the gs:// listing DoFns: a storage client per worker, images kept and batched
    per bundle (a batch when full, the rest when the bundle finishes), counted as listed."""

    make_batch = FileBatch

    def __init__(self, root: str, extensions: tuple[str, ...], progress_key: str | None):
        super().__init__(progress_key)
        self._root, self._extensions = root, extensions
        self._bucket = split_gcs_path(root)[0]
        self._lister: Lister | None = None
        self._prefixes = Metrics.counter(self.__class__, "prefixes_listed")

    def setup(self) -> None:
        super().setup()
        self._lister = lister(self._bucket)

    def _image(self, name: str, size: int) -> Iterator[FileBatch | pvalue.TaggedOutput]:
        """An object's FileBatch (an image) or ARCHIVES output (a tar archive); nothing else."""
        if name.endswith("/"):
            return
        archive = archive_kind(name) is not None
        if not archive and not has_image_extension(name, self._extensions):
            return
        path = f"{GCS_SCHEME}{self._bucket}/{name}"
        relpath = relative_path(path, self._root)
        if not is_listed(relpath):  # hidden entries, as in the local walk (listing.is_hidden)
            return
        if archive:
            yield pvalue.TaggedOutput(ARCHIVES, archive_in(path, self._root, size))
        else:
            yield from map(self.counted, self.batched(ImageFile(path=path, relpath=relpath, size=size)))

    def _path(self, prefix: str) -> str:
        return f"{GCS_SCHEME}{self._bucket}/{prefix}"

    def finish_bundle(self) -> Iterable:
        for batch in super().finish_bundle():
            self.counted(batch.value)
            yield batch


class ListLevelFn(_GcsListFn):
    """(prefix, width) -> FileBatches of the images directly in it (main output), the tar
    archives there (ARCHIVES), and its prefixes as (prefix, width), tagged EXPAND (list one
    level down) or BELOW (list whole)."""

    def __init__(
        self,
        root: str,
        extensions: tuple[str, ...],
        progress_key: str | None = None,
        *,
        last_level: bool,
        target: int = FANOUT_TARGET,
    ):
        super().__init__(root, extensions, progress_key)
        self._last_level, self._target = last_level, target

    def process(self, element: tuple[str, int]) -> Iterable:
        prefix, width = element
        self._prefixes.inc()
        try:
            for kind, value in list_level(self._lister, prefix, width, self._last_level, self._target):
                if kind == OBJECT:
                    yield from self._image(*value)
                else:
                    yield pvalue.TaggedOutput(kind, value)
        except LIST_ERRORS as e:
            raise _cannot_list(self._path(prefix), e) from None


class ListBelowFn(_GcsListFn):
    """(prefix, width) -> FileBatches of the images below the prefix, at any depth; ARCHIVES:
    the tar archives there."""

    def process(self, element: tuple[str, int]) -> Iterable[FileBatch]:
        prefix, _ = element
        self._prefixes.inc()
        try:
            for name, size in list_below(self._lister, prefix):
                yield from self._image(name, size)
        except LIST_ERRORS as e:
            raise _cannot_list(self._path(prefix), e) from None


def _root_element(_: bytes, prefix: str) -> tuple[str, int]:
    return prefix, 1


class GcsListing(NamedTuple):
    """What ListGcsImages gives: `files` (FileBatch) and `archives` (ArchiveFile, for IndexArchives)."""

    files: beam.PCollection[FileBatch]
    archives: beam.PCollection


class ListGcsImages(beam.PTransform):
    """Lists every image below a gs:// root, the listing fanned out by prefix (module docstring).

    Args:
      root: `gs://bucket` or `gs://bucket/prefix`.
      extensions: lower-case suffixes of the files kept.
      progress_key: the run whose live Progress counts the listed images, if any.
      target: stop fanning out at about this many prefixes a level (FANOUT_TARGET).
      levels: list at most this many levels with the delimiter (FANOUT_LEVELS), >= 1.

    Returns:
      GcsListing: `.files`, every image file once (no order is implied), and `.archives`,
      every tar archive found (listed by IndexArchives).
    """

    def __init__(
        self,
        root: str,
        extensions: tuple[str, ...],
        progress_key: str | None = None,
        *,
        target: int | None = None,
        levels: int | None = None,
    ):
        super().__init__()
        target = FANOUT_TARGET if target is None else target
        levels = FANOUT_LEVELS if levels is None else levels
        if levels < 1 or target < 1:
            raise ValueError("levels and target must be positive")
        self._prefix = split_gcs_path(root)[1]
        self._root, self._extensions, self._key = root.rstrip("/"), extensions, progress_key
        self._target, self._levels = target, levels

    def expand(self, pbegin: beam.pvalue.PBegin) -> GcsListing:
        root, extensions, key = self._root, self._extensions, self._key
        expand = (
            pbegin
            | "Start" >> beam.Impulse()
            | "Root" >> beam.Map(_root_element, self._prefix)  # (prefix, width)
        )
        files, archives, below = [], [], []
        for level in range(self._levels):
            if level:
                expand = expand | f"SpreadLevel{level}" >> beam.Reshuffle()
            fn = ListLevelFn(root, extensions, key, last_level=level == self._levels - 1, target=self._target)
            listed = expand | f"ListLevel{level}" >> beam.ParDo(fn).with_output_types(FileBatch).with_outputs(
                EXPAND, BELOW, ARCHIVES, main="files"
            )
            files.append(listed.files)  # FileBatch
            archives.append(listed[ARCHIVES])  # ArchiveFile
            below.append(listed[BELOW])  # (prefix, width)
            expand = listed[EXPAND]  # (prefix, width); empty after the last level
        whole = (
            below
            | "AllBelow" >> beam.Flatten()
            | "SpreadPrefixes" >> beam.Reshuffle()
            | "ListBelow"
            >> beam.ParDo(ListBelowFn(root, extensions, key))
            .with_output_types(FileBatch)
            .with_outputs(ARCHIVES, main="files")
        )
        return GcsListing(
            files=[*files, whole.files] | "AllFiles" >> beam.Flatten().with_output_types(FileBatch),
            archives=[*archives, whole[ARCHIVES]] | "AllArchives" >> beam.Flatten(),
        )
