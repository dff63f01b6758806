"""build_pipeline: the conversion as a Beam graph, one labelled step a line.

    ListImages -> LabelFromFolders -> AssignSplits -> PlanShards -> WriteShards -> WriteMetadata

With --labels (a table) the labelling step is ReadLabels + JoinLabels (a CoGroupByKey on the
image key) instead of LabelFromFolders, and WriteOrphans reports rows without an image.

Only metadata (ImageRecord: path, label, size) is shuffled; image bytes are read inside
WriteShards, right where they are encoded and written.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.options import ConvertOptions, join_settings, table_spec
from transforms.encode import EncodeSettings
from transforms.label_table import ORPHANS, STATS, JoinLabels, ReadLabels, WriteOrphans, load_label_map
from transforms.labels import BuildClassIndex, LabelFromFolders
from transforms.layout import AssignSplits, PlanShards, parse_split_ratios
from transforms.listing import ListImages, normalize_root
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

    label_map = load_label_map(opts.label_map) if opts.label_map else None
    by_folder = opts.splits == "folders"

    files = p | "ListImages" >> ListImages(opts.input)  # ImageFile(path, relpath, size)
    listed, label_report = files, None
    if opts.labels_path:  # labels from a table, joined by image key
        spec, join = table_spec(opts), join_settings(opts, label_map)
        table = p | "ReadLabels" >> ReadLabels(spec)  # LabelRow(key, labels, split, extras)
        labeled = (files, table) | "JoinLabels" >> JoinLabels(opts.image_key, join)  # .records, .failed
        report = {ORPHANS: labeled.orphans, STATS: labeled.stats}  # OrphanRow, (count name, n)
        label_report = report | "WriteOrphans" >> WriteOrphans(output_dir, spec, join)  # {"labels": {..}}
        listed = labeled.listed  # ImageRecord | Failure: every image but skipped unlabeled ones
    else:
        labeled = files | "LabelFromFolders" >> LabelFromFolders(by_folder)  # .records, .failed
    records = labeled.records | "AssignSplits" >> AssignSplits(ratios, opts.seed)  # ImageRecord
    label_type = opts.label_type if opts.labels_path else "str"
    classes = records | "BuildClassIndex" >> BuildClassIndex(
        opts.label_offset, names=label_map, label_type=label_type
    )  # singleton ClassIndex
    tasks = records | "PlanShards" >> PlanShards(
        opts.seed, target_bytes, opts.num_shards or None
    )  # ShardTask
    shards = tasks | "WriteShards" >> WriteShards(
        output_dir, temp_dir, classes, opts.compression, settings
    )  # .shards ShardResult, .written Written, .failed Failure
    failures = (labeled.failed, shards.failed) | "FlattenFailures" >> beam.Flatten()
    summary = p | "WriteMetadata" >> WriteMetadata(
        output_dir,
        temp_dir,
        opts.compression,
        files=listed,
        records=records,
        written=shards.written,
        failed=failures,
        shards=shards.shards,
        class_index=classes,
        summary_extras=label_report,
    )  # the summary.json dict
    return PipelineOutputs(summary=summary, failures=failures)
