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
    """One shard of `records` in `out` (published as a run publishes it, with summary.json and the
    TFDS metadata): (the writer's outcome, the summary, the shard's path)."""
    encode = EncodeSettings(**settings)
    outcome = write_shard(
        ShardTask("train", 0, records), class_index, ShardJob(str(out / "tmp"), settings=encode)
    )
    result = outcome.result
    assert result is not None, outcome.failures
    failed = FailureCounts(
        len(outcome.failures), (("annotations", len(outcome.failures)),) if outcome.failures else ()
    )
    listed = {}
    for r in records:
        listed[("train", r.class_key)] = listed.get(("train", r.class_key), 0) + 1
    summary = build_summary(
        len(records),
        listed,
        dict(result.written),
        failed,
        [result],
        class_index,
        encode,
        dict(result.objects),
    )
    shard = out / "train-00000-of-00001.tfrecord"
    shutil.move(result.temp_path, shard)
    write_reader_metadata(
        str(out),
        summary,
        schema_from_summary(summary),
        {"train": [result.records]},
        "none",
        set(result.formats),
    )
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "labels.txt").write_text("".join(n + "\n" for n in class_index.names))
    os.makedirs(out, exist_ok=True)
    return outcome, summary, shard
