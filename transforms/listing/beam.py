"""ListImages: list image files under a root: a local walk, a gs:// listing fanned out by
prefix over workers (transforms/listing/gcs.py), or Beam's MatchFiles for other filesystems.

The root may also be a tar archive, a glob of archives, or a folder/prefix that holds
archives (`.tar`, `.tar.gz`, `.tgz`) next to or instead of image files: the walk sends each
archive it finds to IndexArchives (transforms/listing/beam_archives.py), which lists its image
members on workers, as if the archive were unpacked where it lies.

The listing runs inside the pipeline (on workers), so the job graph stays the same size
whatever the number of files. Files leave in FileBatches of up to BATCH_SIZE (one element
per image would cost Beam more than the listing itself). The listing DoFn also counts the
listed images (live progress and the Beam counter `images_listed`), so counting costs no
step of its own.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
from apache_beam.io import fileio

from transforms.coders import FileBatchCoder  # noqa: F401 - registers the record coders
from transforms.failures import FAILED, Failure
from transforms.gcs import literal_or_glob
from transforms.listing.beam_walk import ARCHIVES, KeepImagesFn, WalkLocalFn
from transforms.listing.local import is_archive_input
from transforms.paths import IMAGE_EXTENSIONS, escape_glob, normalize_root
from transforms.records import FileBatch


class ListedImages(NamedTuple):
    """What ListImages gives: `files` (FileBatch), `failed` (Failure, stage 'list') and
    `sample_labels` (tuples of SampleLabel from WebDataset sidecars; empty unless asked for)."""

    files: beam.PCollection[FileBatch]
    failed: beam.PCollection[Failure]
    sample_labels: beam.PCollection[tuple]


class ListImages(beam.PTransform):
    """Lists every image file below `root`, at any depth, and every image member of the
    archives there (or of the archives `root` names: a tar file or a glob of them).

    Args:
      progress_key: the run whose live Progress counts the listed images, if any.
      copies_dir: where a `.tar.gz` is decompressed to (see transforms/listing/beam_archives.py).
      webdataset: also read the label sidecars of WebDataset samples (`key.cls`, ...).

    Returns:
      ListedImages: `.files`, every matched file and archive member once (no order is
      implied), and `.failed`, what was found in archives but cannot be listed.
    """

    def __init__(
        self,
        root: str,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
        progress_key: str | None = None,
        copies_dir: str | None = None,
        webdataset: bool = False,
    ):
        super().__init__()
        self._webdataset = webdataset
        self._root = normalize_root(root)
        self._extensions = tuple(e.lower() for e in extensions)
        self._progress_key = progress_key
        self._copies_dir = copies_dir

    def expand(self, pbegin: beam.pvalue.PBegin) -> ListedImages:
        from transforms.listing.beam_archives import SAMPLE_LABELS, IndexArchives, MatchArchivesFn

        root, extensions, key = self._root, self._extensions, self._progress_key
        if is_archive_input(root):
            files: beam.PCollection[FileBatch] = pbegin | "NoFiles" >> beam.Create([]).with_output_types(
                FileBatch
            )
            archives = (
                pbegin
                | "Start" >> beam.Impulse()
                | "MatchArchives" >> beam.ParDo(MatchArchivesFn(literal_or_glob(root)))
            )
        elif "://" not in root:
            walked = (
                pbegin
                | "Start" >> beam.Impulse()  # one step, where a Create of the root would be four
                | "WalkLocal"
                >> beam.ParDo(WalkLocalFn(root, extensions, key))
                .with_output_types(FileBatch)
                .with_outputs(ARCHIVES, main="files")
            )
            files, archives = walked.files, walked[ARCHIVES]
        elif root.startswith("gs://"):
            from transforms.listing.beam_gcs import ListGcsImages  # built on this module's helpers

            listed = pbegin | "ListBucket" >> ListGcsImages(root, extensions, key)
            files, archives = listed.files, listed.archives
        else:
            matched = (
                pbegin
                | "MatchFiles"
                >> fileio.MatchFiles(
                    escape_glob(root) + "/**", empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW
                )
                | "KeepImages"
                >> beam.ParDo(KeepImagesFn(root, extensions, key))
                .with_output_types(FileBatch)
                .with_outputs(ARCHIVES, main="files")
            )
            files, archives = matched.files, matched[ARCHIVES]
        index = IndexArchives(extensions, self._copies_dir, key, self._webdataset)
        members = archives | "IndexArchives" >> index
        return ListedImages(
            files=(files, members.files) | "AllFiles" >> beam.Flatten(),
            failed=members[FAILED],
            sample_labels=members[SAMPLE_LABELS],
        )
