"""summary.json (pure): the counts per split and class, and the accounting check listed == written + failed.

Sections computed by other steps join it as small dicts (`merge_sections`): "labels" (the
labels join), "skipped" (the listing: transforms/listing/skips.py) and "labels_per_record" /
"empty_splits" (`record_counts`, `records_section`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from transforms.encoding.encoder import EncodeSettings
from transforms.layout.prescan import DEDUPE_STAGE
from transforms.output.failure_log import FailureCounts
from transforms.records import ClassIndex, RecordBatch, ShardResult

_SPLIT, _LABELS = "split", "labels"


def build_summary(
    listed_total: int,
    listed: dict[tuple[str, str], int],
    written: dict[tuple[str, str], int],
    failures: FailureCounts,
    shards: list[ShardResult],
    class_index: ClassIndex,
    settings: EncodeSettings | None = None,
    objects: dict[tuple[str, str, str], int] | None = None,
) -> dict:
    """The summary.json document. Invariant: listed == written + failed at every level.

    Duplicates dropped by --dedupe are failures (stage 'dedupe'), also counted in
    `duplicates`; `schema`, `rename_keys`, `store` and `image_format` say how to parse.
    `objects`: the written records' object counts (ShardResult.objects, summed): an "objects"
    section when there are any (a dataset of boxes, masks or class maps).
    """

    splits: dict[str, dict] = {}

    def add(split: str, cls: str | None, field: str, n: int) -> None:
        zeros = {"listed": 0, "written": 0, "failed": 0}
        entry = splits.setdefault(split, {**zeros, "shards": 0, "bytes": 0, "classes": {}})
        entry[field] += n
        if cls is not None:
            entry["classes"].setdefault(cls, dict(zeros))[field] += n

    for field, counts in (
        ("listed", listed.items()),
        ("written", written.items()),
        ("failed", failures.by_class),
    ):
        for (split, cls), n in counts:
            add(split, cls, field, n)
    for s in shards:
        add(s.split, None, "shards", 1)
        add(s.split, None, "bytes", s.bytes)
    for entry in splits.values():
        entry["classes"] = dict(sorted(entry["classes"].items()))
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
        "class_names": list(class_index.names),
        "label_offset": class_index.offset,
        "splits": dict(sorted(splits.items())),
        # How images were stored and which schema to parse them with (transforms.encoding.schema).
        "schema": settings.schema,
        "rename_keys": dict(settings.rename_keys),
        "store": settings.store,
        "image_format": settings.image_format,
        "duplicates": by_stage.get(DEDUPE_STAGE, 0),
    }
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
        problems += [mismatch(f"class {c!r} of split {split!r}", v) for c, v in entry["classes"].items()]
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
