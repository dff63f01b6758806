"""Small metadata records that travel through the pipeline.

Image bytes never travel in a PCollection: only these records do, so every shuffle
(join, split assignment, shard planning) moves a few hundred bytes per image.

Between listing and shard planning the records travel in batches (FileBatch, RecordBatch:
up to BATCH_SIZE images an element), because Beam's cost per element (DoFn calls, coders,
counters) is many times the plain work per image there. Steps that are per image by nature
(dedupe) take single records inside and batch them again on the way out
(transforms/batching.py); the labels join shuffles batches by key bucket
(transforms/labels/beam_table.py).
"""

from __future__ import annotations

import dataclasses

# Images per FileBatch / RecordBatch: few elements per run, each small (~200 KB coded).
BATCH_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """One listed file. `relpath` is '/'-separated and relative to the input root."""

    path: str
    relpath: str
    size: int


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """A listed image with everything known before its bytes are read.

    Attributes:
      path: full path (local or gs://).
      relpath: path relative to the input root; written as `image/filename`.
      size: file size in bytes (used to plan shard sizes).
      labels: class names of the image (one for single-label data; may be empty
        for unlabeled inference sets).
      split: name of the split the image is written to.
      extras: further (name, value) features carried into the Example.
    """

    path: str
    relpath: str
    size: int
    labels: tuple[str, ...] = ()
    split: str = "train"
    extras: tuple[tuple[str, object], ...] = ()

    @property
    def class_key(self) -> str:
        """The label text used for per-class counts (multi-labels joined by '|')."""
        return "|".join(self.labels)


@dataclasses.dataclass(frozen=True)
class FileBatch:
    """Listed files travelling as one element (see the module docstring)."""

    files: tuple[ImageFile, ...]

    def __len__(self) -> int:
        return len(self.files)

    def columns(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
        """The files as three equal-length columns: (paths, relpaths, sizes)."""
        if not self.files:
            return (), (), ()
        paths, relpaths, sizes = zip(*((f.path, f.relpath, f.size) for f in self.files))
        return paths, relpaths, sizes


@dataclasses.dataclass(frozen=True)
class RecordBatch:
    """ImageRecords travelling as one element (see the module docstring)."""

    records: tuple[ImageRecord, ...]

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def from_columns(
        cls,
        paths: tuple[str, ...],
        relpaths: tuple[str, ...],
        sizes: tuple[int, ...],
        labels: tuple[tuple[str, ...], ...],
        splits: tuple[str, ...],
        extras: tuple[tuple[tuple[str, object], ...], ...],
    ) -> RecordBatch:
        """A batch from equal-length columns, one value per record in each."""
        return cls(tuple(map(ImageRecord, paths, relpaths, sizes, labels, splits, extras)))


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """All records of one output shard, in the order they are written."""

    split: str
    index: int
    records: tuple[ImageRecord, ...]


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """A shard written to its temporary path, waiting to be renamed."""

    split: str
    index: int
    temp_path: str
    records: int
    bytes: int
    formats: tuple[str, ...] = ()  # image formats stored in the shard (metadata for readers)
    # ((split, class_key), images written), sorted: what the summary counts per class.
    written: tuple[tuple[tuple[str, str], int], ...] = ()


@dataclasses.dataclass(frozen=True)
class ClassIndex:
    """Class names in id order: `names[i]` has id `i + offset` (made by labels, read by encoding and writing)."""

    names: tuple[str, ...]
    offset: int = 0

    def id_of(self, name: str) -> int:
        return self._ids()[name]

    def _ids(self) -> dict[str, int]:
        ids = self.__dict__.get("_ids_cache")
        if ids is None:
            ids = {n: i + self.offset for i, n in enumerate(self.names)}
            object.__setattr__(self, "_ids_cache", ids)
        return ids
