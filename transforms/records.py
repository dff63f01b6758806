"""Small metadata records that travel through the pipeline (image bytes never do).

Every shuffle (join, split assignment, shard planning) moves a few hundred bytes an image.
Between listing and shard planning records travel in batches (FileBatch, RecordBatch: up to
BATCH_SIZE images an element), because Beam's cost per element (DoFn calls, coders,
counters) is many times the plain work per image there. A batch holds *columns*, one tuple
per field, so Beam's compiled FastPrimitivesCoder codes it as a handful of tuples
(transforms/coders.py) and a consumer reads the columns it needs without one Python object
per image (`batch.records` / `batch.files` build them on demand). Per-image steps (dedupe)
batch again on the way out (transforms/batching.py). A RecordBatch may also carry its
records' seeded hashes (`hashes`, HASH_BYTES a record, made once by the layout stage:
transforms/layout/plan.py `record_hashes`), read by split assignment, shard planning and
the order inside a shard.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

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
    """A listed image with everything known before its bytes are read: its full path, its path
    relative to the input root (written as `image/filename`), file size (plans shard sizes),
    class names (one for single-label data, none for unlabeled sets), split, and further
    (name, value) features carried into the Example."""

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


# Separator of the joined paths of a column: no path of any filesystem holds a NUL.
_PATH_SEP = "\x00"


def root_of(paths: Sequence[str], relpaths: Sequence[str]) -> str | None:
    """The root that every path is, followed by its relpath (a listing's files), or None: checked
    on the whole column at once (two joins, one comparison), so that a coder sends the root alone."""
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
    """Each relpath after `root`: the paths `root_of` found."""
    return tuple(map(root.__add__, relpaths))


class _Columns:
    """Equality, hash and repr of a batch of columns (`columns()`), shared by FileBatch and RecordBatch."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.relpaths)  # not the paths: a RecordBatch's may be unbuilt (from_root)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.columns() == other.columns()

    def __hash__(self) -> int:
        return hash(self.columns())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)}: {self.relpaths[:3]!r}...)"


class FileBatch(_Columns):
    """Listed files travelling as one element, as columns (paths, relpaths, sizes): from
    ImageFiles, or `from_columns` (no ImageFile built). Immutable by convention."""

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


# A RecordBatch's columns but the paths (which may be built from a root: from_root).
_REST = ("relpaths", "sizes", "labels", "splits", "extras")


class RecordBatch(_Columns):
    """ImageRecords travelling as one element, as columns (see the module docstring).

    `RecordBatch(records)` takes ImageRecords; `from_columns` equal-length columns (no
    ImageRecord built). `hashes`: the records' seeded hashes for seed `hash_seed`, or None.
    Immutable by convention. A batch decoded from paths coded as one root keeps the root and
    builds `paths` only when read (`from_root`): planning never reads most paths, and `take`,
    `slice`, `concat` and `with_columns` keep the root, so it is coded as the root again.
    """

    __slots__ = ("_paths", "_root", *_REST, "hashes", "hash_seed", "_records")

    def __init__(self, records: Iterable[ImageRecord] = ()):
        records = tuple(records)
        self._paths: tuple[str, ...] | None = tuple([r.path for r in records])
        self._root: str | None = None
        self.relpaths = tuple([r.relpath for r in records])
        self.sizes = tuple([r.size for r in records])
        self.labels = tuple([r.labels for r in records])
        self.splits = tuple([r.split for r in records])
        self.extras = tuple([r.extras for r in records])
        self.hashes: bytes | None = None
        self.hash_seed: int | None = None
        self._records: tuple[ImageRecord, ...] | None = records

    @classmethod
    def from_columns(
        cls, paths: Sequence[str], relpaths: Sequence[str], *rest: Any, **named: Any
    ) -> RecordBatch:
        """A batch of equal-length columns: the paths, then from_root's columns (hashes optional)."""
        if len(paths) != len(relpaths):
            raise ValueError("RecordBatch columns of different lengths")
        batch = cls.from_root(None, relpaths, *rest, **named)
        batch._paths = tuple(paths)
        return batch

    @classmethod
    def from_root(
        cls,
        root: str | None,
        relpaths: Sequence[str],
        sizes: Sequence[int],
        labels: Sequence[tuple[str, ...]],
        splits: Sequence[str],
        extras: Sequence[tuple],
        hashes: bytes | None = None,
        hash_seed: int | None = None,
    ) -> RecordBatch:
        """A batch whose every path is `root` + its relpath (`paths` built when first read)."""
        n = len(relpaths)
        if not n == len(sizes) == len(labels) == len(splits) == len(extras):
            raise ValueError("RecordBatch columns of different lengths")
        if hashes is not None and len(hashes) != n * HASH_BYTES:
            raise ValueError("RecordBatch hashes of the wrong length")
        batch = cls.__new__(cls)
        batch._paths, batch._root, batch._records = None, root, None
        batch.relpaths, batch.sizes = tuple(relpaths), tuple(sizes)
        batch.labels, batch.splits, batch.extras = tuple(labels), tuple(splits), tuple(extras)
        batch.hashes, batch.hash_seed = (hashes, hash_seed) if hashes is not None else (None, None)
        return batch

    @property
    def paths(self) -> tuple[str, ...]:
        """Each record's full path (built from the root on first read, for a batch `from_root`)."""
        if self._paths is None:
            self._paths = rooted_paths(self._root, self.relpaths)
        return self._paths

    @property
    def root(self) -> str | None:
        """The root known to precede every relpath (`from_root`), else None (the paths may still share one)."""
        return self._root

    def _rest(self) -> tuple:
        """The columns but the paths: (relpaths, sizes, labels, splits, extras)."""
        return self.relpaths, self.sizes, self.labels, self.splits, self.extras

    def _derived(self, pick: Callable[[Sequence], Sequence], hashes: bytes | None) -> RecordBatch:
        """A batch of `pick(column)` of each column, this batch's root kept (paths unbuilt)."""
        rest = tuple(map(pick, self._rest()))
        if self._root is not None:
            return RecordBatch.from_root(self._root, *rest, hashes, self.hash_seed)
        return RecordBatch.from_columns(pick(self.paths), *rest, hashes, self.hash_seed)

    def columns(self) -> tuple:
        """(paths, relpaths, sizes, labels, splits, extras)."""
        return self.paths, *self._rest()

    def class_keys(self) -> list[str]:
        """Each record's ImageRecord.class_key (its labels joined by '|')."""
        return ["|".join(labels) for labels in self.labels]

    @property
    def records(self) -> tuple[ImageRecord, ...]:
        """The records as ImageRecord objects (built on first use)."""
        if self._records is None:
            self._records = tuple(itertools.starmap(ImageRecord, zip(*self.columns())))
        return self._records

    def __reduce__(self) -> tuple:
        return RecordBatch.from_columns, (*self.columns(), self.hashes, self.hash_seed)

    def with_columns(self, **columns: Any) -> RecordBatch:
        """A copy with some columns replaced (e.g. `splits=...`, `hashes=..., hash_seed=...`)."""
        fields = dict(zip((*_REST, "hashes", "hash_seed"), (*self._rest(), self.hashes, self.hash_seed)))
        fields.update(columns)
        if self._root is not None and "paths" not in columns and "relpaths" not in columns:
            return RecordBatch.from_root(self._root, **fields)
        return RecordBatch.from_columns(**{"paths": self.paths, **fields})

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
        roots = {b._root for b in batches}
        one_root = len(roots) == 1 and None not in roots  # the paths stay unbuilt
        parts = [b._rest() if one_root else b.columns() for b in batches]
        columns = [tuple(itertools.chain.from_iterable(c)) for c in zip(*parts)] or [()] * 6
        if one_root:
            return RecordBatch.from_root(roots.pop(), *columns, hashes=hashes, hash_seed=seed)
        return RecordBatch.from_columns(*columns, hashes=hashes, hash_seed=seed)


@dataclasses.dataclass(init=False, unsafe_hash=True, slots=True)
class ShardTask:
    """All records of one output shard, in the order they are written, as a RecordBatch.

    Takes a RecordBatch (its seeded hashes dropped: a shard is written in its planned order)
    or ImageRecords. A shard holds up to --max_records_per_shard records (10,000 by default):
    as columns it costs the runner its strings and ints, not an ImageRecord (and, pickled,
    its `__dict__`) per image. `iter_records` builds the objects one at a time. Immutable by
    convention.
    """

    split: str
    index: int
    batch: RecordBatch

    def __init__(self, split: str, index: int, records: RecordBatch | Iterable[ImageRecord] = ()):
        self.split, self.index = split, index
        batch = records if isinstance(records, RecordBatch) else RecordBatch(records)
        paths, relpaths, sizes, labels, splits, extras = batch.columns()
        # A shard's records come decoded from its group, each with its own copy of its split
        # name and label tuple (~160 bytes an image): held for the whole write, one of each.
        seen: dict = {}
        labels = tuple([seen.setdefault(x, x) for x in labels])
        if all(s == split for s in splits):
            splits = (split,) * len(splits)
        else:
            splits = tuple(map(seen.setdefault, splits, splits))
        self.batch = RecordBatch.from_columns(paths, relpaths, sizes, labels, splits, extras)

    @property
    def records(self) -> tuple[ImageRecord, ...]:
        """The records as ImageRecord objects (built on each use)."""
        return tuple(self.iter_records())

    def iter_records(self) -> Iterator[ImageRecord]:
        """The records as ImageRecord objects, built one at a time as they are consumed."""
        return itertools.starmap(ImageRecord, zip(*self.batch.columns()))

    def sizes_sum(self) -> int:
        """Bytes of the shard's image files (as listed)."""
        return sum(self.batch.sizes)

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
