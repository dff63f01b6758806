"""Small metadata records that travel through the pipeline (image bytes never do).

Between listing and shard planning records travel in batches of up to BATCH_SIZE (FileBatch,
RecordBatch): Beam's cost per element is many times the plain work per image there. A batch
holds *columns*, one tuple per field, coded as a handful of tuples (transforms/coders.py);
`batch.records` / `batch.files` build the objects on demand. A RecordBatch may carry its
records' seeded hashes (`hashes`, HASH_BYTES a record: transforms/layout/plan.py
`record_hashes`), read by split assignment, shard planning and the order inside a shard, and
its records' annotations (`objects`, transforms/objects.py: detection and segmentation), or None
for a batch without any (classification: nothing is added to its records or their coded form).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from transforms.objects import Objects

# Images per FileBatch / RecordBatch: few elements per run, each small (~200 KB coded).
BATCH_SIZE = 1000

# Bytes of a record's seeded hashes in RecordBatch.hashes (split hash, then shuffle hash).
HASH_BYTES = 16
_HASH_DTYPE = np.dtype((np.void, HASH_BYTES))


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """One listed file. `relpath` is '/'-separated and relative to the input root."""

    path: str
    relpath: str
    size: int


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """A listed image before its bytes are read: `relpath` is written as `image/filename`, `size`
    plans shard sizes, `labels` are class names (none when unlabeled), `extras` further (name,
    value) features carried into the Example, `objects` its annotations (boxes, masks) or None."""

    path: str
    relpath: str
    size: int
    labels: tuple[str, ...] = ()
    split: str = "train"
    extras: tuple[tuple[str, object], ...] = ()
    objects: Objects | None = None

    @property
    def class_key(self) -> str:
        """The label text used for per-class counts (multi-labels joined by '|')."""
        return "|".join(self.labels)


# Separator of the joined paths of a column: no path of any filesystem holds a NUL.
_PATH_SEP = "\x00"


def root_of(paths: Sequence[str], relpaths: Sequence[str]) -> str | None:
    """The root that precedes each relpath in its path (a listing's files), or None: checked on
    the whole column at once (two joins, one comparison), so that a coder sends the root alone."""
    if not paths or not relpaths[0] or type(paths[0]) is not str or not paths[0].endswith(relpaths[0]):
        return None
    root = paths[0][: len(paths[0]) - len(relpaths[0])]
    try:
        joined = _PATH_SEP.join(paths)
        if joined.count(_PATH_SEP) != len(paths) - 1 or joined != root + (_PATH_SEP + root).join(relpaths):
            return None
    except TypeError:
        return None
    return root


def rooted_paths(root: str, relpaths: Sequence[str]) -> tuple[str, ...]:
    """Each relpath after `root` (what `root_of` found)."""
    return tuple(map(root.__add__, relpaths))


class _Columns:
    """Equality, hash and repr of a batch by its `columns()`."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.relpaths)

    def _identity(self) -> tuple:
        return self.columns()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)}: {self.relpaths[:3]!r}...)"


class FileBatch(_Columns):
    """Listed files as columns (paths, relpaths, sizes): from ImageFiles, or `from_columns`."""

    __slots__ = ("paths", "relpaths", "sizes")

    def __init__(self, files: Iterable[ImageFile] = ()):
        files = tuple(files)
        self.paths = tuple([f.path for f in files])
        self.relpaths = tuple([f.relpath for f in files])
        self.sizes = tuple([f.size for f in files])

    @classmethod
    def from_columns(cls, paths: Sequence[str], relpaths: Sequence[str], sizes: Sequence[int]) -> FileBatch:
        if not len(paths) == len(relpaths) == len(sizes):
            raise ValueError("FileBatch columns of different lengths")
        batch = cls.__new__(cls)
        batch.paths, batch.relpaths, batch.sizes = tuple(paths), tuple(relpaths), tuple(sizes)
        return batch

    def columns(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
        """(paths, relpaths, sizes)."""
        return self.paths, self.relpaths, self.sizes

    @property
    def files(self) -> tuple[ImageFile, ...]:
        return tuple(itertools.starmap(ImageFile, zip(*self.columns())))

    def __reduce__(self) -> tuple:
        return FileBatch.from_columns, self.columns()


_COLUMNS = ("paths", "relpaths", "sizes", "labels", "splits", "extras")


class RecordBatch(_Columns):
    """ImageRecords as columns: from ImageRecords, or `from_columns` (equal-length columns).
    `hashes`: the records' seeded hashes for seed `hash_seed`, or None. `objects`: each record's
    Objects (or None), or None when no record has any. Immutable by convention."""

    __slots__ = (*_COLUMNS, "hashes", "hash_seed", "objects", "_records")

    def __init__(self, records: Iterable[ImageRecord] = ()):
        records = tuple(records)
        self.paths = tuple([r.path for r in records])
        self.relpaths = tuple([r.relpath for r in records])
        self.sizes = tuple([r.size for r in records])
        self.labels = tuple([r.labels for r in records])
        self.splits = tuple([r.split for r in records])
        self.extras = tuple([r.extras for r in records])
        self.hashes: bytes | None = None
        self.hash_seed: int | None = None
        objects = tuple([r.objects for r in records])
        self.objects = objects if objects.count(None) != len(objects) else None
        self._records: tuple[ImageRecord, ...] | None = records

    @classmethod
    def from_columns(
        cls,
        paths: Sequence[str],
        relpaths: Sequence[str],
        sizes: Sequence[int],
        labels: Sequence[tuple[str, ...]],
        splits: Sequence[str],
        extras: Sequence[tuple],
        hashes: bytes | None = None,
        hash_seed: int | None = None,
        objects: Sequence[Objects | None] | None = None,
    ) -> RecordBatch:
        """`objects`: each record's Objects or None (a background image is `Objects.empty()`, not None)."""
        n = len(paths)
        if not n == len(relpaths) == len(sizes) == len(labels) == len(splits) == len(extras):
            raise ValueError("RecordBatch columns of different lengths")
        if hashes is not None and len(hashes) != n * HASH_BYTES:
            raise ValueError("RecordBatch hashes of the wrong length")
        if objects is not None and len(objects) != n:
            raise ValueError("RecordBatch objects of the wrong length")
        batch = cls.__new__(cls)
        batch.paths, batch.relpaths, batch.sizes = tuple(paths), tuple(relpaths), tuple(sizes)
        batch.labels, batch.splits, batch.extras = tuple(labels), tuple(splits), tuple(extras)
        batch.hashes, batch.hash_seed = (hashes, hash_seed) if hashes is not None else (None, None)
        batch.objects = tuple(objects) if objects is not None else None
        batch._records = None
        return batch

    def _derived(self, pick: Callable[[Sequence], Sequence], hashes: bytes | None) -> RecordBatch:
        """A batch of `pick(column)` of each column."""
        objects = None if self.objects is None else pick(self.objects)
        return RecordBatch.from_columns(*map(pick, self.columns()), hashes, self.hash_seed, objects)

    def columns(self) -> tuple:
        """(paths, relpaths, sizes, labels, splits, extras): objects and hashes are apart."""
        return self.paths, self.relpaths, self.sizes, self.labels, self.splits, self.extras

    def _identity(self) -> tuple:
        return self.columns() if self.objects is None else (*self.columns(), self.objects)

    def class_keys(self) -> list[str]:
        """Each record's ImageRecord.class_key (its labels joined by '|')."""
        return ["|".join(labels) for labels in self.labels]

    @property
    def records(self) -> tuple[ImageRecord, ...]:
        """The records as ImageRecord objects (built on first use)."""
        if self._records is None:
            self._records = tuple(itertools.starmap(ImageRecord, zip(*self.record_columns())))
        return self._records

    def record_columns(self) -> tuple:
        """The columns in ImageRecord's field order: columns(), then objects when there are any."""
        return self.columns() if self.objects is None else (*self.columns(), self.objects)

    def __reduce__(self) -> tuple:
        return RecordBatch.from_columns, (*self.columns(), self.hashes, self.hash_seed, self.objects)

    def with_columns(self, **columns: Any) -> RecordBatch:
        """A copy with some columns replaced (e.g. `splits=...`, `hashes=..., hash_seed=...`, `objects=...`)."""
        names = (*_COLUMNS, "hashes", "hash_seed", "objects")
        fields = dict(zip(names, (*self.columns(), self.hashes, self.hash_seed, self.objects)))
        return RecordBatch.from_columns(**{**fields, **columns})

    def take(self, indices: Sequence[int]) -> RecordBatch:
        """The records at `indices`, in that order (hashes kept)."""
        hashes = self.hashes
        if hashes is not None:
            hashes = np.frombuffer(hashes, dtype=_HASH_DTYPE)[np.asarray(indices, dtype=np.intp)].tobytes()
        if len(indices) > 1:
            return self._derived(operator.itemgetter(*indices), hashes)  # tuples, gathered in C
        return self._derived(lambda column: tuple(column[i] for i in indices), hashes)

    def slice(self, start: int, stop: int) -> RecordBatch:
        """The records start..stop-1 (hashes kept)."""
        hashes = self.hashes[start * HASH_BYTES : stop * HASH_BYTES] if self.hashes is not None else None
        return self._derived(lambda column: column[start:stop], hashes)

    def chunks(self, size: int = BATCH_SIZE) -> list[RecordBatch]:
        """The batch cut into batches of `size` records (the last may be smaller; none if empty)."""
        if len(self) <= size:
            return [self] if len(self) else []
        return [self.slice(i, i + size) for i in range(0, len(self), size)]

    @staticmethod
    def concat(batches: Iterable[RecordBatch]) -> RecordBatch:
        """One batch of every record of `batches`, in order (hashes kept when all have them, same seed)."""
        batches = list(batches)
        if len(batches) == 1:
            return batches[0]
        seeds = {b.hash_seed for b in batches}
        hashes = seed = None
        if len(seeds) == 1 and None not in seeds and all(b.hashes is not None for b in batches):
            hashes, seed = b"".join(b.hashes for b in batches), seeds.pop()
        parts = zip(*(b.columns() for b in batches))
        columns = [tuple(itertools.chain.from_iterable(c)) for c in parts] or [()] * 6
        objects = None
        if any(b.objects is not None for b in batches):
            objects = tuple(itertools.chain.from_iterable(b.objects or (None,) * len(b) for b in batches))
        return RecordBatch.from_columns(*columns, hashes=hashes, hash_seed=seed, objects=objects)


@dataclasses.dataclass(init=False, unsafe_hash=True, slots=True)
class ShardTask:
    """All records of one output shard in write order, as a RecordBatch without hashes: up to
    --max_records_per_shard (10,000 by default) cost the runner their strings and ints, not an
    ImageRecord each (`iter_records` builds them one at a time). Immutable by convention."""

    split: str
    index: int
    batch: RecordBatch

    def __init__(self, split: str, index: int, records: RecordBatch | Iterable[ImageRecord] = ()):
        self.split, self.index = split, index
        batch = records if isinstance(records, RecordBatch) else RecordBatch(records)
        paths, relpaths, sizes, labels, splits, extras = batch.columns()
        # A shard's records come from many decoded batches, each with its own copies of the
        # split names and label tuples (~160 bytes an image): held for the whole write, one of each.
        seen: dict = {}
        labels, splits = (tuple(map(seen.setdefault, column, column)) for column in (labels, splits))
        self.batch = RecordBatch.from_columns(
            paths, relpaths, sizes, labels, splits, extras, objects=batch.objects
        )

    @property
    def records(self) -> tuple[ImageRecord, ...]:
        """The records as ImageRecord objects (built on each use)."""
        return tuple(self.iter_records())

    def iter_records(self) -> Iterator[ImageRecord]:
        """The records as ImageRecord objects, built one at a time as they are consumed."""
        return itertools.starmap(ImageRecord, zip(*self.batch.record_columns()))

    def part(self, start: int, stop: int) -> ShardTask:
        """The same shard with only its records start..stop-1 (a part written apart and joined)."""
        return ShardTask(self.split, self.index, self.batch.slice(start, stop))

    def __len__(self) -> int:
        return len(self.batch)

    def __reduce__(self) -> tuple:
        return ShardTask, (self.split, self.index, self.batch)


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
    # ((count, split, name), n), sorted: the objects written per class, background images, boxes
    # clipped or dropped by kind ... (writing/shard.py `object_counts`); () without objects.
    objects: tuple[tuple[tuple[str, str, str], int], ...] = ()


@dataclasses.dataclass(frozen=True)
class ClassIndex:
    """Class names in id order: `names[i]` has id `i + offset` (made by labels, read by encoding and writing)."""

    names: tuple[str, ...]
    offset: int = 0

    def id_of(self, name: str) -> int:
        return self._ids[name]

    @functools.cached_property
    def _ids(self) -> dict[str, int]:
        return {n: i + self.offset for i, n in enumerate(self.names)}
