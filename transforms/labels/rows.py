"""The labels table's records (pure): its spec, rows, join parts, orphans, label maps, join
settings, and the names of the flags' choices."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterable
from typing import NamedTuple

from transforms.records import BATCH_SIZE, ImageFile

FORMATS = ("csv", "tsv", "jsonl")
_FORMAT_OF_SUFFIX = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".zst", ".deflate")
IMAGE_KEYS = ("stem", "name", "relpath")
UNLABELED_POLICIES = ("fail", "skip", "keep")
DUPLICATE_POLICIES = ("fail", "first", "union")
LABEL_TYPES = ("auto", "int", "str")
EXTRA_TYPES = ("int", "float", "str")
ORPHANS_FILE = "orphan_labels.jsonl"
STAGE = "label"

# Tagged outputs of JoinLabelsFn (FAILED comes from transforms.failures).
ORPHANS, STATS, LISTED = "orphans", "stats", "listed"

# Counts reported under "labels" in summary.json (always present, 0 when nothing happened).
STAT_NAMES = (
    "rows",
    "matched_rows",
    "orphan_rows",
    "invalid_rows",
    "duplicate_keys",
    "conflicting_keys",
    "keys_with_several_images",
    "unlabeled_images",
    "unlabeled_skipped",
    "unlabeled_kept",
)

# Items a BucketFn holds at most before it sends them (bounds its memory).
_MAX_HELD = 100 * BATCH_SIZE
_SPLIT_NAME = re.compile(r"\w[\w.-]*")


class TableError(ValueError):
    """The table as a whole cannot be read (missing column, not UTF-8, not CSV)."""


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """Where the labels table is (a file or glob, local or gs://), its format (FORMATS), and
    which columns mean what: `separator` splits a label cell ('' = never), `split_column`
    ('' = none), `extra_columns` ((column, type) pairs carried into the Example)."""

    path: str
    format: str
    key_column: str = "id"
    label_column: str = "label"
    separator: str = "|"
    split_column: str = ""
    extra_columns: tuple[tuple[str, str], ...] = ()

    def required_columns(self) -> tuple[str, ...]:
        split = (self.split_column,) if self.split_column else ()
        return (self.key_column, self.label_column, *split, *(name for name, _ in self.extra_columns))


class LabelRow(NamedTuple):
    """One row of the table, parsed (a row that cannot be used carries `error`); a named
    tuple, made in a fraction of a dataclass's time."""

    key: str
    labels: tuple[str, ...] = ()
    split: str | None = None
    extras: tuple[tuple[str, object], ...] = ()
    source: str = ""
    line: int = 0
    error: str | None = None

    def content(self) -> tuple:
        """What the row says about its image (two rows saying the same are duplicates)."""
        return self.labels, self.split, self.extras

    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclasses.dataclass(frozen=True)
class LabelRows:
    """Table rows as one element, column i holding field i of LabelRow for every row (up to
    BATCH_SIZE, in file order): no object is made per row from the parse to the join."""

    keys: tuple[str, ...] = ()
    labels: tuple[tuple[str, ...], ...] = ()
    splits: tuple[str | None, ...] = ()
    extras: tuple[tuple[tuple[str, object], ...], ...] = ()
    sources: tuple[str, ...] = ()
    lines: tuple[int, ...] = ()
    errors: tuple[str | None, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of(cls, rows: Iterable[LabelRow]) -> LabelRows:
        """The batch of these rows (LabelRow tuples)."""
        rows = tuple(rows)
        return cls(*zip(*rows)) if rows else cls()

    @property
    def rows(self) -> tuple[LabelRow, ...]:
        """The rows as LabelRow tuples (one object a row: for tests)."""
        return tuple(map(_new_row, zip(*self.columns()))) if self.keys else ()

    def columns(self) -> tuple[tuple, ...]:
        """The seven columns, in LabelRow's field order."""
        return self.keys, self.labels, self.splits, self.extras, self.sources, self.lines, self.errors


@dataclasses.dataclass(frozen=True)
class KeyedFiles:
    """Listed files with their join keys, column by column: the images side of the join."""

    keys: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    relpaths: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    def columns(self) -> tuple[tuple, ...]:
        return self.keys, self.paths, self.relpaths, self.sizes

    def file(self, i: int) -> ImageFile:
        return ImageFile(self.paths[i], self.relpaths[i], self.sizes[i])


@dataclasses.dataclass(frozen=True)
class JoinPart:
    """Images or table rows of one join bucket (what crosses its shuffle, one side filled)."""

    files: KeyedFiles = KeyedFiles()
    rows: LabelRows = LabelRows()

    def __len__(self) -> int:
        return len(self.files) + len(self.rows)


@dataclasses.dataclass(frozen=True)
class OrphanRow:
    """A table row that no listed image matched (or that could not be parsed)."""

    key: str
    source: str
    line: int
    reason: str
    # (source, line) of the first row of this key: a key's orphan rows are written together,
    # where its first row is (order). Not written out, not compared.
    first: tuple[str, int] = dataclasses.field(default=("", 0), compare=False, repr=False)

    def to_json(self) -> str:
        """The row's line of orphan_labels.jsonl: its fields as JSON, keys sorted."""
        fields = {"key": self.key, "line": self.line, "reason": self.reason, "source": self.source}
        text = json.dumps(fields, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes of a file name: escaped
            text = json.dumps(fields)
        return text

    def order(self) -> tuple:
        """Where the row goes in orphan_labels.jsonl: keys by their first row, a key's rows
        together in file order (the same on every runner)."""
        first = self.first if self.first[0] else (self.source, self.line)
        return first, self.source, self.line, self.key, self.reason


@dataclasses.dataclass(frozen=True)
class OrphanLines:
    """Orphan rows of one join bucket whose keys start in one `chunk` of table lines
    (join.orphan_lines), as `lines` (OrphanRow.order(), OrphanRow.to_json()): the orphans
    travel a batch a bucket, not one element a row."""

    chunk: tuple[str, int]
    lines: tuple[tuple[tuple, str], ...]


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """The classes of --label_map: names in id order (labels.txt and the TFDS ClassLabel
    names), `names[i]` having id `first_id + i` (the smallest id of an id,name table, else
    --label_offset)."""

    names: tuple[str, ...]
    first_id: int = 0

    @functools.cached_property
    def lookup(self) -> dict[str, str]:
        """Label text -> class name: each name stands for itself, and each id (as text) for its
        name unless that text is itself a name."""
        found = {name: name for name in self.names}
        for i, name in enumerate(self.names):
            found.setdefault(str(self.first_id + i), name)
        return found


@dataclasses.dataclass(frozen=True)
class JoinSettings:
    """How JoinLabels turns rows into labelled records: --unlabeled (an image without a
    label row), --duplicate_keys (rows of one key that disagree), --label_type ('int' makes
    non-integer labels failures), --label_map (other labels fail), and whether the split is
    the first folder of the image's path."""

    unlabeled: str = "fail"
    duplicates: str = "fail"
    label_type: str = "auto"
    label_map: LabelMap | None = None
    split_from_folders: bool = False


# A LabelRow from a tuple of its 7 fields (a C call: no Python frame per row).
_new_row = functools.partial(tuple.__new__, LabelRow)
