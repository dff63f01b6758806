"""summary.json (pure): the counts per split and class (class_counts.csv beyond SUMMARY_CLASSES),
and the accounting check listed == written + failed.

Sections computed by other steps join it as small dicts (`merge_sections`): "labels" (the
labels join), "skipped" (the listing: transforms/listing/skips.py) and "labels_per_record" /
"empty_splits" (`record_counts`, `records_section`).
"""

from __future__ import annotations

import collections
import csv
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence

from transforms.encoding.encoder import EncodeSettings
from transforms.layout.prescan import DEDUPE_STAGE
from transforms.output.failure_log import FailureCounts
from transforms.records import ClassIndex, RecordBatch, ShardResult

_SPLIT, _LABELS = "split", "labels"

# Per-class counts are in summary.json up to this many (split, class) pairs; beyond, they are in
# CLASS_COUNTS_FILE, so that summary.json (what a scheduler reads) stays small for any class count.
SUMMARY_CLASSES = 1000
CLASS_COUNTS_FILE = "class_counts.csv"


def class_counts(
    listed: dict[tuple[str, str], int], written: dict[tuple[str, str], int], failures: FailureCounts
) -> dict[tuple[str, str], list[int]]:
    """[listed, written, failed] per (split, class key) (bounded by splits x classes)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for at, pairs in enumerate((listed.items(), written.items(), failures.by_class)):
        for key, n in pairs:
            counts.setdefault(key, [0, 0, 0])[at] += n
    return counts


def class_count_lines(counts: dict[tuple[str, str], list[int]]) -> Iterator[str]:
    """CLASS_COUNTS_FILE's lines (CSV: split, class, listed, written, failed; by split and class)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("split", "class", "listed", "written", "failed"))
    for (split, cls), n in sorted(counts.items()):
        writer.writerow((split, cls, *n))
        if out.tell() > 1 << 16:
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()


def class_mismatch(counts: dict[tuple[str, str], list[int]]) -> str | None:
    """The first (split, class) where listed != written + failed, or None (accounting_error's rule)."""
    for (split, cls), (listed, written, failed) in sorted(counts.items()):
        if listed != written + failed:
            return f"class {cls!r} of split {split!r}: listed {listed} != written {written} + failed {failed}"
    return None


def build_summary(
    listed_total: int,
    listed: dict[tuple[str, str], int],
    written: dict[tuple[str, str], int],
    failures: FailureCounts,
    shards: list[ShardResult],
    class_index: ClassIndex,
    settings: EncodeSettings | None = None,
    objects: dict[tuple[str, str, str], int] | None = None,
    counts: dict[tuple[str, str], list[int]] | None = None,
) -> dict:
    """The summary.json document: counts, never a copy of the class names (labels.txt has
    them). Invariant: listed == written + failed at every level.

    Per-class counts (`classes` of each split, `written_per_class`) are in it up to
    SUMMARY_CLASSES (split, class) pairs; beyond, in CLASS_COUNTS_FILE (`class_counts_file`).
    Duplicates dropped by --dedupe are failures (stage 'dedupe'), also counted in `duplicates`;
    `schema`, `rename_keys`, `store` and `image_format` say how to parse.
    `objects`: the written records' object counts (ShardResult.objects, summed): an "objects"
    section when there are any (a dataset of boxes, masks or class maps).
    """
    counts = class_counts(listed, written, failures) if counts is None else counts
    per_class = len(counts) <= SUMMARY_CLASSES
    fields = ("listed", "written", "failed")
    splits: dict[str, dict] = {}
    for (split, cls), n in sorted(counts.items()):
        entry = splits.setdefault(split, {**dict.fromkeys(fields, 0), "shards": 0, "bytes": 0})
        for field, value in zip(fields, n):
            entry[field] += value
        if per_class:
            entry.setdefault("classes", {})[cls] = dict(zip(fields, n))
    for s in shards:
        entry = splits.setdefault(s.split, {**dict.fromkeys(fields, 0), "shards": 0, "bytes": 0})
        entry["shards"] += 1
        entry["bytes"] += s.bytes
    for entry in splits.values():
        entry.setdefault("classes", {}) if per_class else None
    written_per_class: collections.Counter = collections.Counter()
    for (_, cls), n in written.items():
        written_per_class[cls] += n
    settings = settings or EncodeSettings()
    by_stage = dict(sorted(failures.by_stage))
    summary = {
        "listed": listed_total,
        "written": sum(written.values()),
        "failed": failures.failed,
        "failed_by_stage": by_stage,
        "written_per_class": dict(sorted(written_per_class.items())),
        "num_classes": len(class_index.names),
        "label_offset": class_index.offset,
        "splits": dict(sorted(splits.items())),
        # How images were stored and which schema to parse them with (transforms.encoding.schema).
        "schema": settings.schema,
        "rename_keys": dict(settings.rename_keys),
        "store": settings.store,
        "image_format": settings.image_format,
        "duplicates": by_stage.get(DEDUPE_STAGE, 0),
    }
    if not per_class:
        del summary["written_per_class"]
        summary["class_counts_file"] = CLASS_COUNTS_FILE
    if objects:
        summary["objects"] = objects_section(objects, settings)
    return summary


def objects_section(counts: dict[tuple[str, str, str], int], settings: EncodeSettings) -> dict:
    """summary.json's "objects": totals, per split (objects per class, images with and without
    objects) and the boxes clipped or dropped per kind (docs/detection.md)."""
    totals: collections.Counter = collections.Counter()
    boxes: collections.Counter = collections.Counter()
    per_split: dict[str, dict] = {}
    for (count, split, name), n in sorted(counts.items()):
        if count == "boxes":
            boxes[name] += n
            continue
        totals[count] += n
        entry = per_split.setdefault(split, {"objects": 0, "images": 0, "background": 0, "classes": {}})
        if count == "objects":
            entry["classes"][name] = entry["classes"].get(name, 0) + n
        if count in entry:
            entry[count] += n
    return {
        "objects": totals["objects"],
        "images_with_objects": totals["images"],
        "background_images": totals["background"],
        "masks": totals["masks"],
        "class_maps": totals["class_maps"],
        "boxes": dict(sorted(boxes.items())),
        "invalid_boxes": settings.invalid_boxes,
        "trust_size": settings.trust_size,
        "splits": per_split,
    }


def accounting_error(summary: dict) -> str | None:
    """Where `listed == written + failed` does not hold (overall, per split, per class), or None:
    checked before anything is published, as a mismatch means a bug lost or double-counted an image."""

    def mismatch(where: str, c: dict) -> str | None:
        if c["listed"] != c["written"] + c["failed"]:
            return f"{where}: listed {c['listed']} != written {c['written']} + failed {c['failed']}"
        return None

    problems = [mismatch("dataset", summary)]
    for split, entry in summary.get("splits", {}).items():
        problems.append(mismatch(f"split {split!r}", entry))
        problems += [
            mismatch(f"class {c!r} of split {split!r}", v) for c, v in entry.get("classes", {}).items()
        ]
    return next((p for p in problems if p), None)


def too_many_failures(failed: int, listed: int, max_ratio: float) -> bool:
    """True when more than `max_ratio` of the listed images failed."""
    return listed > 0 and failed > max_ratio * listed


def record_counts(batch: RecordBatch) -> list[tuple[tuple[str, object], int]]:
    """((SPLIT, split), records) and ((LABELS, labels a record has), records) of a batch:
    summed by batching.SumPerKeyFn (bounded by the splits and the distinct label counts)."""
    splits = collections.Counter(batch.splits).items()
    labels = collections.Counter(map(len, batch.labels)).items()
    return [*(((_SPLIT, s), n) for s, n in splits), *(((_LABELS, k), n) for k, n in labels)]


def records_section(counts: Mapping[tuple[str, object], int], requested_splits: Sequence[str]) -> dict:
    """summary.json's `labels_per_record` ({"min", "max"} over every labelled record: readers
    parse the label as a scalar when both are 1) and `empty_splits` (the splits --splits asked
    for that got no image), from record_counts' sums."""
    per_record = [k for kind, k in counts if kind == _LABELS]
    seen = {s for kind, s in counts if kind == _SPLIT}
    section: dict = {"empty_splits": [s for s in requested_splits if s not in seen]}
    if per_record:
        section["labels_per_record"] = {"min": min(per_record), "max": max(per_record)}
    return section


def merge_sections(sections: Iterable[dict]) -> dict:
    """The summary sections made by several steps, as one dict (their keys are distinct), in
    key order: the same summary.json text however the runner's bundles fell."""
    merged: dict = {}
    for section in sections:
        merged.update(section)
    return dict(sorted(merged.items()))


def single_label(summary: Mapping) -> bool | None:
    """True when every record of the dataset has exactly one label, False when some have
    none or several, None when the summary does not say (written before `labels_per_record`)."""
    counts = summary.get("labels_per_record")
    if not counts:
        return None
    return counts.get("min") == counts.get("max") == 1
