"""WebDatasetLabels: the labels of WebDataset sidecars as a labels table (`--labels webdataset`).

In: tuples of SampleLabel (an image's relpath and its sample's `.cls`/`.txt`/`.json` label,
from transforms/listing/archives.py). Out: Arrow batches of rows keyed by --image_key,
joined as a table's. Bounds: a tuple of up to BATCH_SIZE labels -> one batch; nothing is gathered.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

from transforms.labels.rows import LabelRow, rows_batch
from transforms.labels.table import image_key, split_labels
from transforms.listing.webdataset import SampleLabel

WEBDATASET = "webdataset"  # the --labels value that asks for sidecar labels


def sample_rows(labels: tuple[SampleLabel, ...], image_key_mode: str, separator: str) -> pa.RecordBatch:
    """The rows of sidecar labels: key by `image_key_mode`, labels split at `separator`
    (a label that split_labels refuses makes a row with an error: its image's failure)."""
    rows = []
    for label in labels:
        key = image_key(label.relpath, image_key_mode)
        try:
            rows.append(LabelRow(key, split_labels(label.value, separator), source=label.source))
        except ValueError as e:
            rows.append(LabelRow(key, source=label.source, error=str(e)))
    return rows_batch(rows)


class WebDatasetLabels(beam.PTransform):
    """Tuples of SampleLabel -> Arrow batches of rows (one per tuple), for JoinLabels."""

    def __init__(self, image_key_mode: str, separator: str = "|"):
        super().__init__()
        self._mode, self._separator = image_key_mode, separator

    def expand(self, labels: beam.PCollection[tuple]) -> beam.PCollection[pa.RecordBatch]:
        to_rows = beam.Map(sample_rows, self._mode, self._separator)
        return labels | "ToRows" >> to_rows.with_output_types(pa.RecordBatch)
