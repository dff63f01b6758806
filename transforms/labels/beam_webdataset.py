"""WebDatasetLabels: the labels of WebDataset sidecars as a labels table (`--labels webdataset`).

In: tuples of SampleLabel (an image's relpath and the label its sample's `.cls`/`.txt`/`.json`
sidecar holds), made while the archives are indexed (transforms/listing/archives.py,
transforms/listing/beam_archives.py). Out: LabelRows, one row per labelled image, keyed by the
image's --image_key like a table row would be. JoinLabels then labels the images exactly as
it does with a table: images of samples without a sidecar follow --unlabeled, rows that
disagree for one key follow --duplicate_keys, and --label_type/--label_map apply.

Bounds: one element is one tuple of up to BATCH_SIZE labels, turned into one LabelRows of
the same size; nothing is gathered.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam

from transforms.labels.rows import LabelRow, LabelRows
from transforms.labels.table import image_key, split_labels
from transforms.listing.webdataset import SampleLabel

WEBDATASET = "webdataset"  # the --labels value that asks for sidecar labels


def sample_rows(labels: tuple[SampleLabel, ...], image_key_mode: str, separator: str) -> LabelRows:
    """The LabelRows of sidecar labels: key by `image_key_mode`, labels split at `separator`.

    A label that is neither text, an integer nor a list of those is a row with an error (the
    join reports it as the image's failure).
    """
    rows = []
    for label in labels:
        key = image_key(label.relpath, image_key_mode)
        try:
            rows.append(LabelRow(key, split_labels(label.value, separator), source=label.source))
        except ValueError as e:
            rows.append(LabelRow(key, source=label.source, error=str(e)))
    return LabelRows.of(rows)


class WebDatasetLabels(beam.PTransform):
    """Tuples of SampleLabel -> LabelRows (one per tuple), for JoinLabels."""

    def __init__(self, image_key_mode: str, separator: str = "|"):
        super().__init__()
        self._mode, self._separator = image_key_mode, separator

    def expand(self, labels: beam.PCollection[tuple]) -> beam.PCollection[LabelRows]:
        mode, separator = self._mode, self._separator

        def rows(batch: tuple[SampleLabel, ...]) -> Iterator[LabelRows]:
            yield sample_rows(batch, mode, separator)

        return labels | "ToRows" >> beam.FlatMap(rows).with_output_types(LabelRows)
