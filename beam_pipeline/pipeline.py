"""build_pipeline: the conversion as a Beam graph, one labelled step a line (README.md's diagram).

    ListImages -> LabelFromFolders | ReadLabels+JoinLabels -> AssignSplits -> PlanShards
               -> WriteShards -> WriteMetadata

Only metadata (path, label, size) is shuffled, in batches of columns (FileBatch, RecordBatch
of up to 1,000 images; transforms/coders.py); image bytes are read inside WriteShards, where
they are encoded and written. No step groups a whole split, class or the failures: the labels
join groups by a hash bucket of the image key, a shard is a range of the seeded hash cut from
per-split totals (a side input) and grouped one shard at a time, --stratify places each class
in a bounded group, and a --label_map is a side input (docs/internals.md).
"""

from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam

from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.settings import encode_settings, join_settings, label_offset, table_spec
from transforms import coders
from transforms.batching import SumPerKeyFn
from transforms.encoding.encoder import EncodeSettings
from transforms.images.read import read_bytes
from transforms.labels.beam import BuildClassIndex, LabelFromFolders, ReadLabelMap
from transforms.labels.beam_table import WEBDATASET, JoinLabels, ReadLabels, WebDatasetLabels
from transforms.labels.rows import ORPHANS, STATS
from transforms.layout.beam import AssignSplits, PlanShards
from transforms.layout.beam_prescan import DropDuplicates, EstimateSizes
from transforms.layout.plan import parse_split_ratios
from transforms.listing.beam import ListedImages, ListImages
from transforms.listing.beam_archives import archive_copies_dir
from transforms.output.beam import WriteMetadata
from transforms.output.beam_orphans import WriteOrphans
from transforms.output.fence import Fence
from transforms.output.publish import staging_dir, temp_dir_for
from transforms.output.summary import record_counts, records_section
from transforms.output.tfds import tfds_name
from transforms.paths import normalize_root
from transforms.progress import FAILED_ANYWHERE, CountProgress
from transforms.writing.beam import WriteShards


def register_coders() -> None:
    """Our coders in Beam's registry, for every record type that crosses a stage boundary.

    A type missing here would be pickled, silently (tests/cli/test_coders_registered.py).
    Called for every graph (registering is idempotent), not on import.
    """
    for record_type, coder in coders.CODERS.items():
        beam.coders.registry.register_coder(record_type, coder)


def build_pipeline(
    p: beam.Pipeline,
    opts: ConvertOptions,
    run_id: str,
    *,
    list_files: Callable[[beam.Pipeline], ListedImages] | None = None,
    reader: Callable[[str], bytes] = read_bytes,
    fence: Fence | None = None,
) -> None:
    """Attaches the conversion to `p` (does not run it).

    Args:
      fence: the output claim's token (main.py); the steps that write into the output folder
        check it, and keep it alive when the job keeps the claim. Default: run `run_id`'s.
      list_files: seam for benchmarks: makes the ListedImages to convert instead of listing
        `opts.input` (benchmarks/scale.py generates millions of names without files).
      reader: seam for benchmarks and tests: how WriteShards reads an image's bytes.
    """
    register_coders()
    output_dir = normalize_root(opts.output_dir)
    temp_dir = temp_dir_for(output_dir, run_id)
    fence = fence or Fence(output_dir, run_id)
    ratios = parse_split_ratios(opts.splits) if opts.splits not in ("", "folders") else ()
    target_bytes = None if opts.num_shards else int(opts.shard_size_mb * 1024 * 1024)
    settings: EncodeSettings = encode_settings(opts)
    # Options that change the stored bytes: plan shards by estimated sizes, not file sizes.
    estimate_with = settings if settings.changes_pixels() else None
    failed: list[beam.PCollection] = []
    webdataset = opts.labels_path == WEBDATASET
    if list_files is None:
        found = p | "ListImages" >> ListImages(
            opts.input, progress_key=run_id, copies_dir=archive_copies_dir(temp_dir), webdataset=webdataset
        )  # .files FileBatch of ImageFile (archive members too), .failed Failure, .sample_labels
    else:
        found = list_files(p)  # ListedImages (benchmarks/scale.py)
    files = found.files
    listed, label_report, label_map = files, None, None
    if opts.label_map:  # read on a worker, a side input: the graph does not grow with the classes
        label_map = p | "ReadLabelMap" >> ReadLabelMap(
            opts.label_map, label_offset(opts)
        )  # singleton LabelMap
    if opts.labels_path:  # labels from a table, joined by image key
        spec, join = table_spec(opts), join_settings(opts)
        if webdataset:  # the labels of the samples' sidecars, as table rows
            table = found.sample_labels | "ReadLabels" >> WebDatasetLabels(
                opts.image_key, opts.label_separator
            )
        else:
            table = p | "ReadLabels" >> ReadLabels(
                spec
            )  # Arrow batches of rows (key, labels, split, extras...)
        labeled = (files, table) | "JoinLabels" >> JoinLabels(
            opts.image_key, join, label_map=label_map
        )  # .records, .failed
        report = {
            ORPHANS: labeled.orphans,
            STATS: labeled.stats,
        }  # Arrow batches of orphan rows, (count name, n)
        label_report = report | "WriteOrphans" >> WriteOrphans(
            staging_dir(temp_dir), spec, join
        )  # {"labels": {..}}
        listed = labeled.listed  # RecordBatch | Failure: every image but skipped unlabeled ones
    else:
        labeled = files | "LabelFromFolders" >> LabelFromFolders(
            opts.splits == "folders"
        )  # .records, .failed
    records = labeled.records | "AssignSplits" >> AssignSplits(
        ratios, opts.seed, opts.stratify
    )  # RecordBatch with splits and seeded hashes (--stratify: class counts, a group per class pack)
    label_type = opts.label_type if opts.labels_path else "str"
    classes = records | "BuildClassIndex" >> BuildClassIndex(
        label_offset(opts), label_map=label_map, label_type=label_type
    )  # singleton ClassIndex (an id,name --label_map gives its own first id)
    record_stats = (
        records
        | "CountSplitsAndLabels" >> beam.CombineGlobally(SumPerKeyFn(record_counts)).without_defaults()
        | "RecordStats" >> beam.Map(records_section, [name for name, _ in ratios])
    )  # {"labels_per_record": {min, max}, "empty_splits": [split]}
    to_plan = records
    if opts.dedupe:
        deduped = records | "DropDuplicates" >> DropDuplicates(estimate_with)  # .records, .failed
        to_plan, failed = deduped.records, [deduped.failed]
    elif estimate_with:
        to_plan = records | "EstimateSizes" >> EstimateSizes(estimate_with)  # RecordBatch, size = estimate
    tasks = to_plan | "PlanShards" >> PlanShards(
        opts.seed, target_bytes, opts.num_shards or None, opts.max_records_per_shard or None
    )  # ShardTask (one shard's ImageRecords in write order; one group per (split, shard))
    shards = tasks | "WriteShards" >> WriteShards(
        output_dir,
        temp_dir,
        classes,
        opts.compression,
        settings,
        write_index=opts.write_index,
        threads=opts.read_threads,
        progress_key=run_id,
        processes=opts.write_processes or 1,
        reader=reader,  # 0 (auto) is resolved for local runs by main.py
        claim=fence,
    )  # .shards ShardResult (with per-class written counts), .failed Failure
    failures = (found.failed, labeled.failed, shards.failed, *failed) | "FlattenFailures" >> beam.Flatten()
    _ = failures | "TrackFailures" >> CountProgress(run_id, FAILED_ANYWHERE)  # live progress, Beam counter
    _ = p | "WriteMetadata" >> WriteMetadata(
        output_dir,
        temp_dir,
        opts.compression,
        files=(listed, found.failed),  # FileBatch | RecordBatch | Failure, each counted where it is made
        records=records,
        failed=failures,
        shards=shards.shards,
        class_index=classes,
        fence=fence,
        settings=settings,
        max_failure_ratio=opts.max_failure_ratio,
        # The TFDS name: same output wherever it is written (reruns compare byte for byte).
        dataset_name=tfds_name(opts.dataset_name or normalize_root(opts.input)),
        summary_extras=[  # summary.json's sections made by other steps: a dict each
            record_stats,
            *(section for section in (found.skipped, found.warnings, label_report) if section is not None),
        ],
    )  # the summary.json dict (failures counted by a combiner, failures.jsonl merged from sorted parts)
