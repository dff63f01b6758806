"""ListGcsImages: a gs:// root -> (FileBatches of images, ArchiveFiles of tar archives, the
counts of what was skipped), the prefixes fanned out over workers (the rule and its bounds: gcs.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from transforms.failures import USER_ERROR_MARKER
from transforms.gcs import ERRORS, GCS_SCHEME, Lister, lister, split_gcs_path
from transforms.listing.beam_walk import ARCHIVES, SKIPPED, _KeepFn
from transforms.listing.gcs import BELOW, EXPAND, FANOUT_LEVELS, FANOUT_TARGET, OBJECT, list_level
from transforms.listing.local import hidden_entry
from transforms.paths import relative_path
from transforms.records import FileBatch


class ListPrefixFn(_KeepFn):
    """(prefix, width) -> FileBatches of the images in it (main output) and its tar archives
    (ARCHIVES). With `whole`, every object below the prefix; else the objects directly in it,
    and its prefixes as (prefix, width), tagged EXPAND (list one level down) or BELOW (list
    whole), but for hidden ones (`.git/`), counted as SKIPPED and never listed.
    A storage client per worker."""

    def __init__(self, root: str, progress_key: str | None, *, whole: bool = False, last_level: bool = False):
        super().__init__(root, progress_key)
        self._bucket = split_gcs_path(root)[0]
        self._whole, self._last_level, self._target = whole, last_level, FANOUT_TARGET
        self._lister: Lister | None = None
        self._prefixes = Metrics.counter(self.__class__, "prefixes_listed")

    def setup(self) -> None:
        super().setup()
        self._lister = lister(self._bucket)

    def process(self, element: tuple[str, int]) -> Iterable[FileBatch | pvalue.TaggedOutput]:
        prefix, width = element
        self._prefixes.inc()
        if self._whole:
            listed = ((OBJECT, entry) for entry in self._lister(prefix, None))
        else:
            listed = list_level(self._lister, prefix, width, self._last_level, self._target)
        try:
            for kind, value in listed:
                if kind == OBJECT:
                    name, size = value
                    yield from self.keep(f"{GCS_SCHEME}{self._bucket}/{name}", size)
                    continue
                below = relative_path(f"{GCS_SCHEME}{self._bucket}/{value[0]}", self._root).rstrip("/")
                hidden = hidden_entry(below)
                if hidden is not None:
                    self.skips.hidden(hidden)
                else:
                    yield pvalue.TaggedOutput(kind, value)
        except ERRORS as e:  # one line for the entry point (exit 2)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f"{USER_ERROR_MARKER} cannot list {GCS_SCHEME}{self._bucket}/{prefix}: {reason}"
            ) from None


class ListGcsImages(beam.PTransform):
    """Lists every image (FileBatch) and tar archive (ArchiveFile) below `gs://bucket[/prefix]`,
    each once (gcs.py), and the counts of the rest (SKIPPED); `progress_key`: the run whose
    live Progress counts the images, if any."""

    def __init__(self, root: str, progress_key: str | None = None):
        super().__init__()
        self._root, self._key, self._prefix = root.rstrip("/"), progress_key, split_gcs_path(root)[1]

    def expand(self, pbegin: beam.pvalue.PBegin) -> tuple[beam.PCollection, ...]:
        root, key, prefix, levels = self._root, self._key, self._prefix, FANOUT_LEVELS
        expand = pbegin | "Start" >> beam.Impulse() | "Root" >> beam.Map(lambda _: (prefix, 1))
        files, archives, below, skipped = [], [], [], []
        for level in range(levels):
            if level:
                expand = expand | f"SpreadLevel{level}" >> beam.Reshuffle()
            fn = ListPrefixFn(root, key, last_level=level == levels - 1)
            listed = expand | f"ListLevel{level}" >> beam.ParDo(fn).with_output_types(FileBatch).with_outputs(
                EXPAND, BELOW, ARCHIVES, SKIPPED, main="files"
            )
            files.append(listed.files)  # FileBatch
            archives.append(listed[ARCHIVES])  # ArchiveFile
            skipped.append(listed[SKIPPED])  # {(reason, extension): n}
            below.append(listed[BELOW])  # (prefix, width)
            expand = listed[EXPAND]  # (prefix, width); empty after the last level
        whole = (
            below
            | "AllBelow" >> beam.Flatten()
            | "SpreadPrefixes" >> beam.Reshuffle()
            | "ListBelow"
            >> beam.ParDo(ListPrefixFn(root, key, whole=True))
            .with_output_types(FileBatch)
            .with_outputs(ARCHIVES, SKIPPED, main="files")
        )
        return (
            [*files, whole.files] | "AllFiles" >> beam.Flatten().with_output_types(FileBatch),
            [*archives, whole[ARCHIVES]] | "AllArchives" >> beam.Flatten(),
            [*skipped, whole[SKIPPED]] | "AllSkipped" >> beam.Flatten(),
        )
