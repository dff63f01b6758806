"""The labels join's buckets and its policy, key by key (pure).

A key's bucket is the range its hash falls in, `crc32(key) * buckets >> 32` (as TFDS assigns
shards from hashed keys), out of a count that grows with the data (bucket_count). In: the
images and table rows of one bucket. Out: labelled ImageRecords, Failures, orphan rows and
counts, under the --unlabeled and --duplicate_keys policies.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter, methodcaller

import numpy as np

from transforms.failures import Failure
from transforms.labels.folders import DEFAULT_SPLIT
from transforms.labels.rows import (
    ORPHANS_FILE,
    STAGE,
    STAT_NAMES,
    JoinPart,
    JoinSettings,
    LabelRow,
    OrphanLines,
    OrphanRow,
    TableSpec,
    _new_row,
)
from transforms.records import BATCH_SIZE, ImageFile, ImageRecord

_KEY_BYTES = methodcaller("encode", "utf-8", "surrogateescape")  # a key as hashed


@dataclasses.dataclass
class JoinResult:
    """Everything the keys of a join produce; the labelled records as the six columns
    RecordBatch.from_columns takes (path, relpath, size, labels, split, extras)."""

    columns: tuple[list, ...] = dataclasses.field(default_factory=lambda: tuple([] for _ in range(6)))
    failures: list[Failure] = dataclasses.field(default_factory=list)
    orphans: list[OrphanRow] = dataclasses.field(default_factory=list)
    stats: dict[str, int] = dataclasses.field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.stats[name] = self.stats.get(name, 0) + n

    def add_record(self, *fields: object) -> None:
        """Adds one record: path, relpath, size, labels, split, extras."""
        for column, value in zip(self.columns, fields):
            column.append(value)

    @property
    def records(self) -> list[ImageRecord]:
        """The labelled records as ImageRecords (for tests)."""
        return list(map(ImageRecord, *self.columns))


def _check_labels(labels: tuple[str, ...], settings: JoinSettings) -> tuple[tuple[str, ...], str | None]:
    """Labels canonicalized for --label_type int, or the reason they are not acceptable."""
    if settings.label_map is not None:
        lookup, out = settings.label_map.lookup, []
        for name in labels:
            found = lookup.get(name)
            if found is None and name.isascii() and name.isdigit():
                found = lookup.get(str(int(name)))  # '007' is id 7
            if found is None:
                return labels, f"label {name!r} is not in --label_map (neither a class name nor an id of it)"
            out.append(found)
        return tuple(dict.fromkeys(out)), None
    if settings.label_type == "int":
        out = []
        for name in labels:
            if not name.isascii() or not name.isdigit():
                return labels, f"label {name!r} is not a non-negative integer (--label_type int)"
            out.append(str(int(name)))
        return tuple(dict.fromkeys(out)), None
    return labels, None


def resolve_rows(rows: list[LabelRow], policy: str) -> tuple[LabelRow | None, str | None, bool]:
    """The usable rows of one key merged: (the row or None if the key fails, the failure
    reason, whether the rows disagreed)."""
    if len(rows) == 1:  # the usual case, answered without sorting
        return rows[0], None, False
    rows = sorted(rows, key=lambda r: (r.source, r.line))
    first = rows[0]
    if len({r.content() for r in rows}) == 1:
        return first, None, False
    if policy == "first":
        return first, None, True
    if policy == "union":
        if len({(r.split, r.extras) for r in rows}) > 1:
            where = ", ".join(r.where() for r in rows[:5])
            return None, f"rows for this key disagree on the split or extra columns ({where})", True
        labels = tuple(dict.fromkeys(name for r in rows for name in r.labels))
        return first._replace(labels=labels), None, False
    shown = "; ".join(f"{'|'.join(r.labels)} at {r.where()}" for r in rows[:5])
    return None, f"conflicting rows for this key in the labels table: {shown}", True


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
    """Joins the images and table rows of one key, into `into` (or a new JoinResult): every
    image ends up a record, a failure or a counted skip; every row labels an image or is an
    orphan."""
    images = sorted(images, key=lambda f: f.path)
    rows = list(rows)
    out = JoinResult() if into is None else into
    out.count("rows", len(rows))
    invalid = sorted((r for r in rows if r.error), key=lambda r: (r.source, r.line))
    out.count("invalid_rows", len(invalid))
    if not images:
        out.count("orphan_rows", len(rows))
        rows = sorted(rows, key=lambda r: (r.source, r.line))
        first = (rows[0].source, rows[0].line) if rows else ("", 0)
        for r in rows:
            out.orphans.append(OrphanRow(r.key, r.source, r.line, r.error or "no image with this key", first))
        return out
    out.count("matched_rows", len(rows))
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
    usable = [r for r in rows if r.labels]
    if not usable:
        if rows:
            reason = f"label missing: the row for key {key!r} has an empty label ({rows[0].where()})"
        else:
            reason = f"label missing: no row for key {key!r} in the labels table"
        out.count("unlabeled_images", len(images))
        for f in images:
            if settings.unlabeled == "skip":
                out.count("unlabeled_skipped")
            elif settings.unlabeled == "keep":
                try:
                    split = _split_of(f.relpath, rows[0] if rows else None, settings)
                except ValueError as e:
                    fail(f, str(e))
                    continue
                out.count("unlabeled_kept")
                out.add_record(f.path, f.relpath, f.size, (), split, ())
            else:
                fail(f, reason)
        return out
    row, problem, conflict = resolve_rows(usable, settings.duplicates)
    if conflict:
        out.count("conflicting_keys")
    if row is None:
        for f in images:
            fail(f, f"key {key!r}: {problem}")
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


def bucket_count(images: int, rows: int, per_bucket: int = BATCH_SIZE) -> int:
    """Buckets of the join: enough that each holds about `per_bucket` images or rows."""
    return max(1, -(-max(images, rows) // per_bucket))


def bucket_parts(columns: Sequence[Sequence], buckets: int) -> Iterator[tuple[int, tuple[tuple, ...]]]:
    """(bucket, its items as columns) of the items given as columns (keys first), in bucket
    order, items in their order: one crc32 a key, one stable sort, each column gathered once."""
    n = len(columns[0])
    if buckets == 1 or n == 1:
        if n:
            yield zlib.crc32(_KEY_BYTES(columns[0][0])) * buckets >> 32, tuple(map(tuple, columns))
        return
    hashes = np.fromiter(map(zlib.crc32, map(_KEY_BYTES, columns[0])), dtype=np.uint64, count=n)
    of = (hashes * np.uint64(buckets)) >> np.uint64(32)
    order = np.argsort(of, kind="stable")
    of = of[order]
    gather = itemgetter(*order.tolist())
    gathered = [gather(column) for column in columns]
    bounds = [0, *(np.flatnonzero(np.diff(of)) + 1).tolist(), n]
    for start, end in zip(bounds, bounds[1:]):
        yield int(of[start]), tuple(column[start:end] for column in gathered)


def take(columns: Iterable[Sequence], indices: Sequence[int]) -> tuple[tuple, ...]:
    """The values at `indices` of each column."""
    return tuple(tuple(map(column.__getitem__, indices)) for column in columns)


def join_bucket(parts: Iterable[JoinPart], settings: JoinSettings) -> JoinResult:
    """Joins one bucket: its images and rows matched by key, column by column.

    The usual keys (one image, one usable row) are joined all at once: the columns taken at
    each key's positions, the labels checked once per distinct tuple. Every other key goes
    to `join_key`, which gives the same outcome for a usual key too. Records come in key
    order, the usual keys' first; the result is the same whatever the bucket count.
    """
    files, rows = _gather(parts)
    (images, file_groups), (table, row_groups) = _positions(files[0]), _positions(rows[0])
    several = file_groups.keys() | row_groups.keys()
    usual = images.keys() & table.keys()
    usual.difference_update(several)
    keys = sorted(usual)
    at_image, at_row = [images[k] for k in keys], [table[k] for k in keys]
    out = JoinResult()
    ok, labels, splits = _usual_outcome(files, rows, at_image, at_row, settings)
    if ok is not None:  # keys whose row or split fails go the general way
        usual.difference_update(k for k, good in zip(keys, ok) if not good)
        keep = [i for i, good in enumerate(ok) if good]
        at_image, at_row = [at_image[i] for i in keep], [at_row[i] for i in keep]
        labels, splits = [labels[i] for i in keep], [splits[i] for i in keep]
    _, paths, relpaths, sizes = files
    for column, values in zip(
        out.columns,
        (*take((paths, relpaths, sizes), at_image), labels, splits, take((rows[3],), at_row)[0]),
    ):
        column.extend(values)
    out.count("rows", len(at_image))
    out.count("matched_rows", len(at_image))
    for key in sorted((images.keys() | table.keys()) - usual):
        file_at = file_groups.get(key) or ([images[key]] if key in images else [])
        row_at = row_groups.get(key) or ([table[key]] if key in table else [])
        found = [ImageFile(files[1][i], files[2][i], files[3][i]) for i in file_at]
        join_key(key, found, [_new_row(tuple(c[i] for c in rows)) for i in row_at], settings, into=out)
    return out


def _gather(parts: Iterable[JoinPart]) -> tuple[list[list], list[list]]:
    """The parts' file columns (keys, paths, relpaths, sizes) and row columns (LabelRow's
    fields), each concatenated."""
    files: list[list] = [[] for _ in range(4)]
    rows: list[list] = [[] for _ in range(7)]
    for part in parts:
        for column, values in zip(files, part.files.columns()):
            column.extend(values)
        for column, values in zip(rows, part.rows.columns()):
            column.extend(values)
    return files, rows


def _positions(keys: list[str]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """A position of each key, and the positions of each key that occurs more than once."""
    at = dict(zip(keys, range(len(keys))))
    groups: dict[str, list[int]] = {}
    if len(at) < len(keys):
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        groups = {key: found for key, found in groups.items() if len(found) > 1}
    return at, groups


def _usual_outcome(
    files: list[list], rows: list[list], at_image: list[int], at_row: list[int], settings: JoinSettings
) -> tuple[list[bool] | None, list, list]:
    """For the usual keys (image at_image[i], row at_row[i]): (ok, labels, splits), the
    checked labels and the split of each, `ok` None when every key is fine, else whether
    each is."""
    errors, labels, splits = map(list, take((rows[6], rows[1], rows[2]), at_row))
    answers = {t: _check_labels(t, settings) for t in set(labels)}  # a bucket has few distinct
    ok: list[bool] | None = None
    if errors.count(None) != len(errors) or () in answers or any(a[1] for a in answers.values()):
        ok = [e is None and bool(t) and answers[t][1] is None for e, t in zip(errors, labels)]
    if any(answers[t][0] is not t for t in answers):
        labels = [answers[t][0] for t in labels]
    if None in splits and not settings.split_from_folders:  # _split_of without a row's split
        splits = [DEFAULT_SPLIT if split is None else split for split in splits]
    elif None in splits:
        relpaths = files[2]
        resolved = []
        for n, (split, i) in enumerate(zip(splits, at_image)):
            if split is None:
                try:
                    split = _split_of(relpaths[i], None, settings)
                except ValueError:
                    ok = ok or [True] * len(splits)
                    ok[n] = False
            resolved.append(split)
        splits = resolved
    return ok, labels, splits


# Table lines per orphan part (bounds a WriteOrphans group and the file's parts per file).
_ORPHAN_CHUNK_LINES = 100_000


def orphan_lines(orphans: Iterable[OrphanRow]) -> list[OrphanLines]:
    """The orphans as OrphanLines, one per chunk they fall in (their key's first row's file
    and chunk of _ORPHAN_CHUNK_LINES lines; chunks in first-seen order)."""
    chunks: dict[tuple[str, int], list[tuple[tuple, str]]] = {}
    for o in orphans:
        order = o.order()
        chunks.setdefault((order[0][0], order[0][1] // _ORPHAN_CHUNK_LINES), []).append((order, o.to_json()))
    return [OrphanLines(chunk, tuple(lines)) for chunk, lines in chunks.items()]


def label_summary(counts: Mapping[str, int], spec: TableSpec, settings: JoinSettings) -> dict:
    """The "labels" section of summary.json."""
    section: dict = {
        "table": spec.path,
        "key_column": spec.key_column,
        "label_column": spec.label_column,
        "unlabeled": settings.unlabeled,
        "duplicate_keys_policy": settings.duplicates,
        "orphans_file": ORPHANS_FILE,
    }
    section.update({name: int(counts.get(name, 0)) for name in STAT_NAMES})
    return {"labels": section}
