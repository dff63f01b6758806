"""ListImages: the image files under a root: a local walk, a gs:// listing fanned out by
prefix over workers (transforms/listing/gcs.py), or Beam's MatchFiles for other filesystems.

The root may also be a tar archive, a glob of archives, or a folder/prefix that holds archives
(`.tar`, `.tar.gz`, `.tgz`): each archive found goes to IndexArchives (beam_archives.py),
which lists its image members on workers as if the archive were unpacked where it lies.

The listing runs on workers, so the job graph is the same size whatever the number of files.
Files leave in FileBatches of up to BATCH_SIZE (one element per image would cost Beam more
than the listing itself); the listing DoFns count them (live progress and `images_listed`).
What they pass over (hidden entries, other extensions, other tar members) leaves as one small
dict of counts a bundle, summed by a lifted combiner into summary.json's "skipped" section
(skips.py: at most MAX_EXTENSIONS extensions named, whatever the number of files).
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
from apache_beam.io import fileio

from transforms.batching import SumPerKeyFn
from transforms.failures import FAILED, Failure
from transforms.gcs import literal_or_glob
from transforms.listing.beam_archives import SAMPLE_LABELS, WARNINGS, IndexArchives, match_archives
from transforms.listing.beam_gcs import ListGcsImages
from transforms.listing.beam_walk import ARCHIVES, SKIPPED, KeepImagesFn, WalkLocalFn
from transforms.listing.local import is_archive_input
from transforms.listing.skips import Key, add_counts, skipped_section
from transforms.paths import escape_glob, normalize_root
from transforms.records import FileBatch


class ListedImages(NamedTuple):
    """What ListImages gives: `files` (FileBatch), `failed` (Failure, stage 'list'),
    `sample_labels` (tuples of SampleLabel from WebDataset sidecars; empty unless asked for)
    `skipped` (one dict, {"skipped": section}: summary.json's section, skips.skipped_section)
    and `warnings` (one dict, {"warnings": {kind: n}}: what was ignored in archives read whole;
    none when nothing was)."""

    files: beam.PCollection[FileBatch]
    failed: beam.PCollection[Failure]
    sample_labels: beam.PCollection[tuple]
    skipped: beam.PCollection[dict] | None = None
    warnings: beam.PCollection[dict] | None = None


class SkippedCountsFn(beam.CombineFn):
    """{(reason, extension): n} dicts -> {"skipped": section} (lifted; the accumulator is
    one such dict, trimmed to MAX_EXTENSIONS extensions by skips.add_counts)."""

    def create_accumulator(self) -> dict[Key, int]:
        return {}

    def add_input(self, acc: dict[Key, int], counts: dict[Key, int]) -> dict[Key, int]:
        return add_counts(acc, counts.items())

    def merge_accumulators(self, accs) -> dict[Key, int]:
        merged: dict[Key, int] = {}
        for acc in accs:
            add_counts(merged, acc.items())
        return merged

    def extract_output(self, acc: dict[Key, int]) -> dict:
        return {"skipped": skipped_section(acc)}


def _one_of_kind(kind: str) -> list[tuple[str, int]]:
    """A warning's (kind, 1), summed per kind (SumPerKeyFn)."""
    return [(kind, 1)]


class ListImages(beam.PTransform):
    """Lists every image file below `root`, at any depth, and every image member of the
    archives there (or of the archives `root` names: a tar file or a glob of them).

    Args:
      progress_key: the run whose live Progress counts the listed images, if any.
      copies_dir: where a `.tar.gz` is decompressed to (beam_archives.py).
      webdataset: also read the label sidecars of WebDataset samples (`key.cls`, ...).

    Returns:
      ListedImages: every matched file and archive member once (no order implied).
    """

    def __init__(
        self,
        root: str,
        progress_key: str | None = None,
        copies_dir: str | None = None,
        webdataset: bool = False,
    ):
        super().__init__()
        self._root, self._progress_key = normalize_root(root), progress_key
        self._copies_dir, self._webdataset = copies_dir, webdataset

    def expand(self, pbegin: beam.pvalue.PBegin) -> ListedImages:
        root, key = self._root, self._progress_key
        skipped = []  # {(reason, extension): n}, one a bundle
        if is_archive_input(root):
            files = pbegin | "NoFiles" >> beam.Create([]).with_output_types(FileBatch)
            archives = (
                pbegin
                | "Start" >> beam.Impulse()
                | "MatchArchives" >> beam.FlatMap(match_archives, literal_or_glob(root))
            )
        elif root.startswith("gs://"):
            files, archives, skipped_here = pbegin | "ListBucket" >> ListGcsImages(root, key)
            skipped.append(skipped_here)
        else:
            if "://" not in root:  # one Impulse step, where a Create of the root would be four
                found, label, fn = pbegin | "Start" >> beam.Impulse(), "WalkLocal", WalkLocalFn
            else:
                pattern = escape_glob(root) + "/**"
                match = fileio.MatchFiles(pattern, empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
                found, label, fn = pbegin | "MatchFiles" >> match, "KeepImages", KeepImagesFn
            pardo = beam.ParDo(fn(root, key)).with_output_types(FileBatch)
            listed = found | label >> pardo.with_outputs(ARCHIVES, SKIPPED, main="files")
            files, archives = listed.files, listed[ARCHIVES]
            skipped.append(listed[SKIPPED])
        index = IndexArchives(self._copies_dir, key, self._webdataset)
        members = archives | "IndexArchives" >> index
        skipped.append(members[SKIPPED])
        return ListedImages(
            files=(files, members.files) | "AllFiles" >> beam.Flatten(),
            failed=members[FAILED],
            sample_labels=members[SAMPLE_LABELS],
            skipped=(
                skipped
                | "AllSkipped" >> beam.Flatten()
                | "CountSkipped" >> beam.CombineGlobally(SkippedCountsFn()).without_defaults()
            ),  # one dict: {"skipped": section}
            warnings=(
                members[WARNINGS]
                | "CountWarnings" >> beam.CombineGlobally(SumPerKeyFn(_one_of_kind)).without_defaults()
                | "WarningsSection" >> beam.Map(lambda counts: {"warnings": dict(sorted(counts.items()))})
            ),  # one dict: {"warnings": {kind: n}} (a handful of kinds)
        )
