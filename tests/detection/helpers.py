"""Shared by the detection tests: records with Objects written through the writer's own function
(writing/shard.py write_shard), and the reader metadata next to them, as a run publishes them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transforms.encoding.encoder import EncodeSettings
from transforms.encoding.schema import schema_from_summary
from transforms.output.failure_log import FailureCounts
from transforms.output.summary import build_summary
from transforms.output.tfds import write_reader_metadata
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.writing.shard import ShardJob, ShardOutcome, write_shard


def write_records(
    out: Path, records: list[ImageRecord], class_index: ClassIndex, **settings
) -> tuple[ShardOutcome, dict, Path]:
    """One shard of `records` (all of one split) in `out` (published as a run publishes it, with
    summary.json and the TFDS metadata): (the writer's outcome, the summary, the shard's path)."""
    outcomes, summary, shards = write_splits(out, records, class_index, **settings)
    assert len(shards) == 1, f"records of {len(shards)} splits: write_splits"
    (split,) = shards
    return outcomes[split], summary, shards[split]


def write_splits(
    out: Path, records: list[ImageRecord], class_index: ClassIndex, **settings
) -> tuple[dict[str, ShardOutcome], dict, dict[str, Path]]:
    """One shard a split of `records` (each record's own split) in `out`, published as a run
    publishes them: ({split: the writer's outcome}, the summary, {split: the shard's path})."""
    encode = EncodeSettings(**settings)
    splits = list(dict.fromkeys(r.split for r in records))
    outcomes, shards, results = {}, {}, []
    for split in splits:
        task = ShardTask(split, 0, [r for r in records if r.split == split])
        outcome = write_shard(task, class_index, ShardJob(str(out / "tmp"), settings=encode))
        assert outcome.result is not None, outcome.failures
        outcomes[split] = outcome
        results.append(outcome.result)
    failures = [f for o in outcomes.values() for f in o.failures]
    failed = FailureCounts(len(failures), (("annotations", len(failures)),) if failures else ())
    listed: dict[tuple[str, str], int] = {}
    for r in records:
        listed[(r.split, r.class_key)] = listed.get((r.split, r.class_key), 0) + 1
    written: dict = {}
    objects: dict = {}
    for result in results:
        written.update(result.written)
        for key, n in result.objects:
            objects[key] = objects.get(key, 0) + n
    summary = build_summary(len(records), listed, written, failed, results, class_index, encode, objects)
    for result in results:
        shards[result.split] = out / f"{result.split}-00000-of-00001.tfrecord"
        shutil.move(result.temp_path, shards[result.split])
    (out / "labels.txt").write_text("".join(n + "\n" for n in class_index.names))
    write_reader_metadata(
        str(out),
        summary,
        schema_from_summary(summary),
        {result.split: [result.records] for result in results},
        "none",
        {f for result in results for f in result.formats},
        class_index=class_index,
        labels_file=str(out / "labels.txt"),
    )
    (out / "summary.json").write_text(json.dumps(summary))
    os.makedirs(out, exist_ok=True)
    return outcomes, summary, shards
