"""build_pipeline: the conversion as a Beam graph, one labelled step a line.

    ListImages -> LabelFromFolders -> AssignSplits -> PlanShards -> WriteShards -> WriteMetadata

Only metadata (ImageRecord: path, label, size) is shuffled; image bytes are read inside
WriteShards, right where they are encoded and written.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.options import ConvertOptions
from transforms.encode import EncodeSettings
from transforms.labels import BuildClassIndex, LabelFromFolders
from transforms.layout import AssignSplits, PlanShards, parse_split_ratios
from transforms.listing import ListImages, normalize_root
from transforms.progress import FAILED_ANYWHERE, LISTED, CountProgress
from transforms.write import WriteMetadata, WriteShards


@dataclasses.dataclass
class PipelineOutputs:
    """Handles on the graph's main PCollections, for tests and callers."""

    summary: beam.PCollection
    failures: beam.PCollection


def temp_dir_for(output_dir: str, run_id: str) -> str:
    """Where shards are written before the final rename (inside the output folder)."""
    return FileSystems.join(output_dir, f"beam-temp-img2tfrecord-{run_id}")


def build_pipeline(p: beam.Pipeline, opts: ConvertOptions, run_id: str) -> PipelineOutputs:
    """Attaches the conversion to `p` (does not run it)."""
    output_dir = normalize_root(opts.output_dir)
    temp_dir = temp_dir_for(output_dir, run_id)
    ratios = parse_split_ratios(opts.splits) if opts.splits not in ("", "folders") else ()
    target_bytes = None if opts.num_shards else int(opts.shard_size_mb * 1024 * 1024)
    settings = EncodeSettings(max_pixels=opts.max_pixels)

    files = p | "ListImages" >> ListImages(opts.input)  # ImageFile(path, relpath, size)
    labeled = files | "LabelFromFolders" >> LabelFromFolders(opts.splits == "folders")  # .records, .failed
    records = labeled.records | "AssignSplits" >> AssignSplits(ratios, opts.seed)  # ImageRecord
    classes = records | "BuildClassIndex" >> BuildClassIndex(opts.label_offset)  # singleton ClassIndex
    tasks = records | "PlanShards" >> PlanShards(
        opts.seed, target_bytes, opts.num_shards or None
    )  # ShardTask
    shards = tasks | "WriteShards" >> WriteShards(
        output_dir,
        temp_dir,
        classes,
        opts.compression,
        settings,
        threads=opts.read_threads,
        progress_key=run_id,
    )  # .shards ShardResult, .written Written, .failed Failure
    failures = (labeled.failed, shards.failed) | "FlattenFailures" >> beam.Flatten()
    _ = files | "TrackListed" >> CountProgress(run_id, LISTED)  # live progress and Beam counters
    _ = failures | "TrackFailures" >> CountProgress(run_id, FAILED_ANYWHERE)
    summary = p | "WriteMetadata" >> WriteMetadata(
        output_dir,
        temp_dir,
        opts.compression,
        files=files,
        records=records,
        written=shards.written,
        failed=failures,
        shards=shards.shards,
        class_index=classes,
    )  # the summary.json dict
    return PipelineOutputs(summary=summary, failures=failures)
