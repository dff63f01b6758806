"""The labels join on Arrow columns (pure): key buckets, the join of one bucket, and the policy
of the keys that need one.

In: Arrow batches of table rows (rows.ROW_COLUMNS) and listed images (FILE_COLUMNS, files_batch),
shuffled by key bucket (bucket_of_keys, bucket_count). Out of join_bucket: labelled records
(RecordBatch columns), Failures, orphan rows (ORPHAN_COLUMNS) and counts, under the --unlabeled
and --duplicate_keys policies. Vectorised for the common case: rows whose key no image has are
orphans (pyarrow.compute is_in), and the keys with one image and one usable row are joined at
once (both sides sorted by key), labels checked once per distinct value; Python goes key by
key (join_key) only for the keys a policy decides (several rows or images, invalid rows, empty
labels, images without a row).

Many rows per key (issue 31: the objects of one image): rows_by_key gathers each key's rows
into one row of lists, in table order, every other column carried along; join a rows_by_key
table to get one per-image value a key (join_bucket would see several rows as duplicates).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.failures import Failure
from transforms.labels.folders import DEFAULT_SPLIT
from transforms.labels.rows import (
    ERROR,
    EXTRA_PREFIX,
    FILE_COLUMNS,
    KEY,
    LABEL_SEP,
    LABELS,
    LINE,
    NO_IMAGE,
    ORPHAN_COLUMNS,
    PATH,
    RELPATH,
    ROOT,
    SIZE,
    SOURCE,
    SPLIT,
    STAGE,
    JoinSettings,
    LabelRow,
    decode_text,
    encode_text,
    extra_names,
    label_rows,
    root_column,
)
from transforms.labels.table import image_keys
from transforms.records import BATCH_SIZE, FileBatch, ImageFile, ImageRecord, root_of

# Rows or images of one bucket sent as one part (one shuffle element).
PART_ROWS = 10 * BATCH_SIZE


@dataclasses.dataclass
class JoinResult:
    """Everything the keys of a join produce; the labelled records as the six columns
    RecordBatch.from_columns takes (path, relpath, size, labels, split, extras); the orphan
    rows as Arrow tables (rows.ORPHAN_COLUMNS)."""

    columns: tuple[list, ...] = dataclasses.field(default_factory=lambda: tuple([] for _ in range(6)))
    failures: list[Failure] = dataclasses.field(default_factory=list)
    orphans: list[pa.Table] = dataclasses.field(default_factory=list)
    stats: dict[str, int] = dataclasses.field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.stats[name] = self.stats.get(name, 0) + n

    def add_record(self, *fields: object) -> None:  # path, relpath, size, labels, split, extras
        for column, value in zip(self.columns, fields):
            column.append(value)

    @property
    def records(self) -> list[ImageRecord]:  # the labelled records as ImageRecords (tests)
        return list(map(ImageRecord, *self.columns))


def files_batch(batch: FileBatch, image_key_mode: str) -> pa.RecordBatch:
    """A FileBatch's files with their join keys, as an Arrow batch of FILE_COLUMNS."""
    paths, relpaths, sizes = batch.columns()
    root = root_of(paths, relpaths)
    n = len(relpaths)
    return pa.RecordBatch.from_arrays(
        [
            encode_text(image_keys(relpaths, image_key_mode)),
            root_column(root or "", n),
            pa.nulls(n, pa.binary()) if root is not None else encode_text(paths),
            encode_text(relpaths),
            pa.array(sizes, pa.int64()),
        ],
        names=list(FILE_COLUMNS),
    )


def bucket_count(images: int, rows: int, per_bucket: int = BATCH_SIZE) -> int:
    """Buckets of the join: enough that each holds about `per_bucket` images or rows."""
    return max(1, -(-max(images, rows) // per_bucket))


def bucket_of_keys(keys: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """Each key's bucket: the range of `buckets` equal ranges its crc32 falls in (as TFDS
    assigns shards from hashed keys). pyarrow.compute has no hash function (25.0: the hash_*
    functions are grouped aggregations), so: zlib's crc32 of each key's bytes, a C call a key."""
    if buckets == 1:
        return np.zeros(len(keys), np.int64)
    hashes = np.fromiter(map(zlib.crc32, keys.to_pylist()), dtype=np.uint64, count=len(keys))
    return ((hashes * np.uint64(buckets)) >> np.uint64(32)).astype(np.int64)


def split_by_bucket(table: pa.Table, buckets: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(bucket, part) of the rows of `table` (keys in KEY), in bucket order, each part up to
    PART_ROWS rows in their order: one hash a key, one stable sort, each column taken once."""
    of = bucket_of_keys(table.column(KEY), buckets)
    order = np.argsort(of, kind="stable")
    of = of[order]
    table = table.take(order).combine_chunks()
    bounds = [0, *(np.flatnonzero(np.diff(of)) + 1).tolist(), len(of)]
    for start, end in zip(bounds, bounds[1:]):
        for at in range(start, end, PART_ROWS):
            yield int(of[start]), table.slice(at, min(end, at + PART_ROWS) - at).to_batches()[0]


def rows_by_key(rows: pa.Table) -> pa.Table:
    """The rows of each key gathered into one row: KEY, then every other column as a list of
    the key's values in table order (a vectorised group-by; issue 31's objects of an image)."""
    others = [name for name in rows.schema.names if name != KEY]
    grouped = rows.group_by(KEY, use_threads=False).aggregate([(name, "list") for name in others])
    return grouped.rename_columns(
        [KEY if n == KEY else n.removesuffix("_list") for n in grouped.schema.names]
    )


def _check_labels(labels: tuple[str, ...], settings: JoinSettings) -> tuple[tuple[str, ...], str | None]:
    """Labels canonicalized for --label_map and --label_type int, or the reason they are not acceptable."""
    if settings.label_map is None and settings.label_type != "int":
        return labels, None
    out = []
    for name in labels:
        if settings.label_map is not None:
            found, problem = (
                settings.label_map.find(name),
                "is not in --label_map (neither a class name nor an id of it)",
            )
        else:
            found = str(int(name)) if name.isascii() and name.isdigit() else None
            problem = "is not a non-negative integer (--label_type int)"
        if found is None:
            return labels, f"label {name!r} {problem}"
        out.append(found)
    return tuple(dict.fromkeys(out)), None


def resolve_rows(rows: list[LabelRow], policy: str) -> tuple[LabelRow | None, str | None, bool]:
    """The valid rows of one key (empty labels too) merged: (the row, or None if the key
    fails; the failure reason; whether the rows disagreed). Under `fail` a row with labels
    and one without disagree; `first` takes the first row as it is; `union` the labels of all."""
    if len(rows) == 1:  # the usual case, answered without sorting
        return rows[0], None, False
    rows = sorted(rows, key=lambda r: (r.source, r.line))
    first, key = rows[0], rows[0].key
    if len({r.content() for r in rows}) == 1:
        return first, None, False
    if policy == "first":
        return first, None, True
    labelled = [r for r in rows if r.labels]
    if policy == "union":
        if len({(r.split, r.extras) for r in labelled}) > 1:
            where = ", ".join(r.where() for r in labelled[:5])
            return None, f"rows for key {key!r} disagree on the split or extra columns ({where})", True
        labels = tuple(dict.fromkeys(name for r in labelled for name in r.labels))
        return (labelled or rows)[0]._replace(labels=labels), None, False
    shown = "; ".join(f"{'|'.join(r.labels) or '(no label)'} at {r.where()}" for r in rows[:5])
    return None, f"conflicting rows for key {key!r} in the labels table: {shown}", True


def _split_of(relpath: str, row: LabelRow | None, settings: JoinSettings) -> str:
    if row is not None and row.split is not None:
        return row.split
    if settings.split_from_folders:
        parts = relpath.split("/")
        if len(parts) < 2:
            raise ValueError("not inside a split folder (expected <split>/...)")
        return parts[0]
    return DEFAULT_SPLIT


def join_key(
    key: str,
    images: Iterable[ImageFile],
    rows: Iterable[LabelRow],
    settings: JoinSettings,
    into: JoinResult | None = None,
) -> JoinResult:
    """Joins the images and table rows of one key that has images, into `into` (or a new
    JoinResult): every image ends up a record, a failure or a counted skip."""
    images = sorted(images, key=lambda f: f.path)
    rows = list(rows)
    out = JoinResult() if into is None else into
    out.count("rows", len(rows))
    out.count("matched_rows", len(rows))
    invalid = sorted((r for r in rows if r.error), key=lambda r: (r.source, r.line))
    out.count("invalid_rows", len(invalid))
    if len(images) > 1:
        out.count("keys_with_several_images")
    if len(rows) > 1:
        out.count("duplicate_keys")

    def fail(f: ImageFile, reason: str, split: str | None = None, class_key: str | None = None) -> None:
        out.failures.append(Failure(f.path, reason, STAGE, split, class_key))

    if invalid:
        r = invalid[0]
        for f in images:
            fail(f, f"bad row for key {key!r} in the labels table ({r.where()}): {r.error}")
        return out
    row, problem, conflict = resolve_rows(rows, settings.duplicates) if rows else (None, None, False)
    if conflict:
        out.count("conflicting_keys")
    if problem:
        for f in images:
            fail(f, problem)
        return out
    if row is None or not row.labels:
        if row is not None:
            reason = f"label missing: the row for key {key!r} has an empty label ({row.where()})"
        else:
            reason = f"label missing: no row for key {key!r} in the labels table"
        out.count("unlabeled_images", len(images))
        for f in images:
            if settings.unlabeled == "skip":
                out.count("unlabeled_skipped")
            elif settings.unlabeled == "keep":
                try:
                    split = _split_of(f.relpath, row, settings)
                except ValueError as e:
                    fail(f, str(e))
                    continue
                out.count("unlabeled_kept")
                out.add_record(f.path, f.relpath, f.size, (), split, ())
            else:
                fail(f, reason)
        return out
    labels, problem = _check_labels(row.labels, settings)
    for f in images:
        if problem:
            # Counted at the top level only, as every label-stage failure: the image
            # never reached a split, so per-split counts stay listed == written + failed.
            fail(f, problem, None, "|".join(labels))
            continue
        try:
            split = _split_of(f.relpath, row, settings)
        except ValueError as e:
            fail(f, str(e), None, "|".join(labels))
            continue
        out.add_record(f.path, f.relpath, f.size, labels, split, row.extras)
    return out


def _repeated(keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The keys that occur more than once."""
    counts = pc.value_counts(keys)
    return counts.field("values").filter(pc.greater(counts.field("counts"), 1))


def _image_files(images: pa.Table) -> list[ImageFile]:
    relpaths = decode_text(images.column(RELPATH))
    roots = decode_text(images.column(ROOT).cast(pa.binary()))
    paths = [
        root + rel if path is None else path
        for root, rel, path in zip(roots, relpaths, decode_text(images.column(PATH)))
    ]
    return list(map(ImageFile, paths, relpaths, images.column(SIZE).to_pylist()))


def _key_by_key(images: pa.Table, rows: pa.Table, settings: JoinSettings, out: JoinResult) -> None:
    """join_key for every key of `images` (with their rows among `rows`), in key order."""
    files: dict[str, list[ImageFile]] = {}
    for key, f in zip(decode_text(images.column(KEY)), _image_files(images)):
        files.setdefault(key, []).append(f)
    found: dict[str, list[LabelRow]] = {}
    for row in label_rows(rows):
        found.setdefault(row.key, []).append(row)
    for key in sorted(files):
        join_key(key, files[key], found.get(key, ()), settings, into=out)


def join_bucket(images: pa.Table, rows: pa.Table, settings: JoinSettings) -> JoinResult:
    """Joins one bucket: its images (FILE_COLUMNS) and table rows (ROW_COLUMNS) by key.

    Rows without an image are orphans; keys with exactly one image and one usable row are
    joined at once (sorted by key on both sides); every other key of an image goes to
    join_key. The result is the same whatever the bucket count.
    """
    out = JoinResult()
    with_image = pc.is_in(rows.column(KEY), value_set=images.column(KEY))
    orphans = rows.filter(pc.invert(with_image))
    if orphans.num_rows:
        out.orphans.append(orphans_of(orphans))
        out.count("rows", orphans.num_rows)
        out.count("orphan_rows", orphans.num_rows)
        out.count("invalid_rows", orphans.num_rows - orphans.column(ERROR).null_count)
    rows = rows.filter(with_image)
    unusual = pc.or_(rows.column(ERROR).is_valid(), pc.equal(rows.column(LABELS), ""))
    policy = pa.concat_arrays(
        [
            _repeated(images.column(KEY)),
            _repeated(rows.column(KEY)),
            rows.column(KEY).filter(unusual).combine_chunks(),
        ]
    )
    has_row = pc.is_in(images.column(KEY), value_set=rows.column(KEY))
    usual_image = pc.and_(has_row, pc.invert(pc.is_in(images.column(KEY), value_set=policy)))
    usual_row = pc.invert(pc.is_in(rows.column(KEY), value_set=policy))
    _join_usual(images.filter(usual_image).sort_by(KEY), rows.filter(usual_row).sort_by(KEY), settings, out)
    _key_by_key(images.filter(pc.invert(usual_image)), rows.filter(pc.invert(usual_row)), settings, out)
    return out


def _join_usual(images: pa.Table, rows: pa.Table, settings: JoinSettings, out: JoinResult) -> None:
    """The keys with one image and one usable row (both tables sorted by key, one row a key),
    at once; key by key (join_key) if a label or a split from the folders may fail."""
    coded = rows.column(LABELS).combine_chunks().dictionary_encode()
    answers = [_check_labels(tuple(t.split(LABEL_SEP)), settings) for t in coded.dictionary.to_pylist()]
    splits = rows.column(SPLIT).to_pylist()
    if any(a[1] for a in answers) or (settings.split_from_folders and None in splits):
        _key_by_key(images, rows, settings, out)
        return
    out.count("rows", images.num_rows)
    out.count("matched_rows", images.num_rows)
    files = _image_files(images)
    names = extra_names(rows)
    extras = [tuple(zip(names, v)) for v in zip(*(rows.column(EXTRA_PREFIX + n).to_pylist() for n in names))]
    columns = (
        [f.path for f in files],
        [f.relpath for f in files],
        [f.size for f in files],
        [answers[i][0] for i in coded.indices.to_pylist()],
        [DEFAULT_SPLIT if s is None else s for s in splits],
        extras if names else [()] * len(files),
    )
    for column, values in zip(out.columns, columns):
        column.extend(values)


def orphans_of(rows: pa.Table) -> pa.Table:
    """The orphan rows of a batch of table rows that no image matched: each row's reason (its
    error, else NO_IMAGE) and, for a key with several rows, its first row (the smallest
    (source, line) of the key; null: the row itself). Sources and reasons as dictionaries."""
    key, source, line = (rows.column(c).combine_chunks() for c in (KEY, SOURCE, LINE))
    first_source, first_line = pa.nulls(len(source), source.type), pa.nulls(len(source), pa.int64())
    counts = pc.value_counts(key)
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):  # keys with several orphan rows: their first row, key by key
        firsts: dict = {}
        again = pc.is_in(key, value_set=repeated)
        at = pc.indices_nonzero(again)
        keys = key.take(at).to_pylist()
        places = list(zip(source.take(at).to_pylist(), line.take(at).to_pylist()))
        for k, place in zip(keys, places):
            firsts[k] = min(firsts.get(k, place), place)
        first_source = pc.replace_with_mask(
            pa.nulls(len(source), pa.string()), again, pa.array([firsts[k][0] for k in keys], pa.string())
        ).dictionary_encode()
        first_line = pc.replace_with_mask(
            first_line, again, pa.array([firsts[k][1] for k in keys], pa.int64())
        )
    reason = pc.coalesce(rows.column(ERROR), NO_IMAGE).combine_chunks().dictionary_encode()
    return pa.table([key, source, line, reason, first_source, first_line], names=list(ORPHAN_COLUMNS))
