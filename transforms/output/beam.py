"""Output: once every shard is written, the metadata staged and everything published.

In: ShardResults (WriteShards), the listed and labelled batches, every Failure, and the kinds
of things ignored on the way (warnings). Out: failures.jsonl (merged from sorted parts),
labels.txt, summary.json and the reader metadata, staged in the run's temp folder next to the
temp shards, then renamed into place, summary.json last (publish.py): the summary dict. Side
inputs are counts (bounded by splits x classes, the stages, MAX_KINDS and the few kinds of
warning), one small ShardResult a shard and one path a failure part; the only group is a
failure part (~PART_SIZE failures).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.batching import SumPerKeyFn, group_size, images_in
from transforms.coders import SideDict
from transforms.encoding.encoder import EncodeSettings
from transforms.encoding.schema import schema_from_summary
from transforms.failures import USER_ERROR_MARKER, Failure, diagnosis_of_kinds, reason_kind
from transforms.labels.beam import split_class_counts
from transforms.labels.rows import ORPHANS_FILE
from transforms.output.failure_log import FailureCounts, add_kinds, merge_parts, part_of, write_part
from transforms.output.fence import Fence
from transforms.output.publish import (
    ABORTED_FAILURES_FILE,
    ABORTED_FILE,
    FAILURES_FILE,
    LABELS_FILE,
    SUMMARY_FILE,
    existing_files,
    folder_exists,
    publish,
    publish_failures_only,
    staging_dir,
)
from transforms.output.summary import (
    CLASS_COUNTS_FILE,
    accounting_error,
    build_summary,
    class_count_lines,
    class_counts,
    class_mismatch,
    merge_sections,
    too_many_failures,
)
from transforms.output.tfds import write_lines, write_reader_metadata
from transforms.records import ClassIndex, FileBatch, RecordBatch, ShardResult
from transforms.writing.files import delete_paths, make_dirs, write_text
from transforms.writing.index import index_path
from transforms.writing.shard import shard_suffix


class FailureCountsFn(beam.CombineFn):
    """Failures -> FailureCounts (lifted: one small accumulator per bundle: Counters by stage,
    by (split, class) and by reason kind, at most MAX_KINDS kinds)."""

    def create_accumulator(self) -> tuple[collections.Counter, ...]:
        return collections.Counter(), collections.Counter(), collections.Counter()

    def add_input(self, acc: tuple, f: Failure) -> tuple:
        stages, classes, kinds = acc
        stages[f.stage] += 1
        if f.split is not None:
            classes[(f.split, f.class_key or "")] += 1
        add_kinds(kinds, [(reason_kind(f.reason), 1)])
        return acc

    def merge_accumulators(self, accs: Iterable[tuple]) -> tuple:
        stages, classes, kinds = self.create_accumulator()
        for more_stages, more_classes, more_kinds in accs:
            stages.update(more_stages)
            classes.update(more_classes)
            add_kinds(kinds, more_kinds.items())
        return stages, classes, kinds

    def extract_output(self, acc: tuple) -> FailureCounts:
        return FailureCounts(sum(acc[0].values()), *(tuple(sorted(c.items())) for c in acc))


class WriteFailurePartsFn(beam.DoFn):
    """(part, [Failure]) -> the part file's path. The group is one part (~PART_SIZE failures)."""

    def __init__(self, staging: str, step: str):
        self._staging, self._sizes = staging, group_size(step)

    def process(self, element: tuple[int, Iterable[Failure]]) -> Iterator[str]:
        part, failures = element
        failures = list(failures)
        self._sizes.update(len(failures))
        yield write_part(self._staging, part, failures)


class FinalizeFn(beam.DoFn):
    """Runs once after every shard is written: stage the metadata, then publish it all
    (publish.py, fenced by the claim's token). Above `max_failure_ratio` only the failures are
    published (a dataset already in the folder is kept) and the reason is left in the staging
    folder, where the entry point finds it (exit 3).

    Safe to run twice (a runner retries the bundle): as Beam's FileBasedSink skips sources
    already renamed, a run whose staging folder is gone (a finished try deletes it last
    before the marker) or holds the abort reason was finalized already. The retry recomputes
    summary.json: the folder holding exactly that is this run's dataset (a marker a crash
    left is removed); anything else means another run took the folder over (ClaimLost).
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        fence: Fence,
        settings: EncodeSettings,
        max_failure_ratio: float,
        dataset_name: str,
    ):
        self._output_dir, self._temp_dir, self._compression = output_dir, temp_dir, compression
        self._fence, self._settings = fence, settings
        self._max_failure_ratio, self._dataset_name = max_failure_ratio, dataset_name

    def process(
        self,
        _,
        listed_total,
        listed,
        written,
        failures: FailureCounts,
        parts,
        shards,
        class_index,
        extras,
    ) -> Iterable[dict]:
        if listed_total == 0:
            delete_paths([self._temp_dir])
            raise ValueError(f"{USER_ERROR_MARKER} the input holds no image files")
        # `written` also holds the object counts, keyed (count, split, name): see WriteMetadata.
        objects = {key: n for key, n in written.items() if len(key) == 3}
        if objects:
            written = {key: n for key, n in written.items() if len(key) == 2}
        counts = class_counts(listed, written, failures)
        summary = build_summary(
            listed_total,
            listed,
            written,
            failures,
            shards,
            class_index,
            self._settings,
            objects,
            counts=counts,
        )
        summary.update(merge_sections(extras))  # sections of other steps ("labels", "skipped", ...)
        aborted = gcs.exists(FileSystems.join(self._temp_dir, ABORTED_FILE))
        if aborted or not folder_exists(self._temp_dir):  # finalized already (see the class docstring)
            if not aborted:  # (stopped short on purpose: the entry point reads why)
                yield self._finalized(summary)
            return
        alive = self._fence.keep_alive()  # a job-kept claim is beaten while this runs (checked first)
        try:
            yield from self._publish(summary, failures, parts, shards, class_index, counts)
        finally:
            alive.stop()

    def _publish(self, summary, failures, parts, shards, class_index, counts) -> Iterable[dict]:
        staging = staging_dir(self._temp_dir)
        make_dirs(staging)
        staged = {n: FileSystems.join(staging, n) for n in (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)}
        merge_parts(parts, staged[FAILURES_FILE])  # streamed: one line held per part
        failed, listed_total = failures.failed, summary["listed"]
        if too_many_failures(failed, listed_total, self._max_failure_ratio):
            # The job succeeds (a raise would print the runner's traceback); the entry point
            # finds the reason in the staging folder and exits with EXIT_TOO_MANY_FAILURES.
            orphans = FileSystems.join(staging, ORPHANS_FILE)  # why rows matched no image: kept too
            also = ((orphans, ORPHANS_FILE),) if gcs.exists(orphans) else ()
            kept = publish_failures_only(self._output_dir, staged[FAILURES_FILE], self._fence, also)
            where = FileSystems.join(self._output_dir, ABORTED_FAILURES_FILE if kept else FAILURES_FILE)
            rows = summary.get("labels", {}).get("orphan_rows", 0)
            unmatched = ""
            if rows and not kept:
                unmatched = f", the {rows:,} table rows that matched no image in {FileSystems.join(self._output_dir, ORPHANS_FILE)}"
            write_text(
                FileSystems.join(self._temp_dir, ABORTED_FILE),
                f"{failed} of {listed_total} images failed ({failed / listed_total:.1%}), "
                f"more than --max_failure_ratio {self._max_failure_ratio:g} allows; no dataset was "
                f"written{' (the dataset already there is kept)' if kept else ''}, the failures are in {where}"
                f"{unmatched}; " + diagnosis_of_kinds(dict(failures.by_kind)),
            )
            return
        write_lines(staged[LABELS_FILE], (n + "\n" for n in class_index.names))
        problem = accounting_error(summary) or class_mismatch(counts)
        if problem:  # a bug, not bad input: fail loudly and publish nothing
            raise RuntimeError(f"images lost or double-counted ({problem}); nothing was published")
        write_text(staged[SUMMARY_FILE], _summary_text(summary))
        # Shards (with their index files) in plan order per split, then the metadata,
        # summary.json last. Which shards have an index file: one listing per temp folder.
        moves = []
        indexed = existing_files([index_path(s.temp_path) for s in shards])
        by_split: dict[str, list[ShardResult]] = collections.defaultdict(list)
        for s in sorted(shards, key=lambda s: (s.index, s.temp_path)):  # plan order
            by_split[s.split].append(s)
        for split, results in sorted(by_split.items()):
            for i, result in enumerate(results):
                final = f"{split}-{i:05d}-of-{len(results):05d}{shard_suffix(self._compression)}"
                moves.append((result.temp_path, final))
                if index_path(result.temp_path) in indexed:
                    moves.append((index_path(result.temp_path), index_path(final)))
        reader_files = write_reader_metadata(
            staging,
            summary,
            schema_from_summary(summary),
            {split: [s.records for s in results] for split, results in by_split.items()},
            self._compression,
            {f for s in shards for f in s.formats},
            name=self._dataset_name,
            class_index=class_index,
            labels_file=staged[LABELS_FILE],
        )
        if CLASS_COUNTS_FILE == summary.get("class_counts_file"):  # many classes: beside summary.json
            write_lines(FileSystems.join(staging, CLASS_COUNTS_FILE), class_count_lines(counts))
            reader_files.append(CLASS_COUNTS_FILE)
        if FileSystems.exists(FileSystems.join(staging, ORPHANS_FILE)):  # written by WriteOrphans
            reader_files.append(ORPHANS_FILE)
        moves += [(FileSystems.join(staging, name), name) for name in reader_files]
        moves += [(staged[name], name) for name in (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)]
        publish(self._output_dir, moves, fence=self._fence, cleanup=(self._temp_dir,))
        yield summary

    def _finalized(self, summary: dict) -> dict:
        """A retried finalize of a published run: its summary.json must be this one."""
        path = FileSystems.join(self._output_dir, SUMMARY_FILE)
        if not gcs.exists(path):
            raise self._fence.lost()
        with FileSystems.open(path) as f:
            if f.read().decode("utf-8") != _summary_text(summary):
                raise self._fence.lost()
        self._fence.remove_marker()
        return summary


def _written_and_objects(shard: ShardResult) -> tuple:
    """A shard's ((split, class), n) written counts, then its ((count, split, name), n) object counts."""
    return shard.written + shard.objects if shard.objects else shard.written


def _summary_text(summary: dict) -> str:
    return json.dumps(summary, indent=2, ensure_ascii=False) + "\n"


class WriteMetadata(beam.PTransform):
    """Waits for every shard, renames them into place and writes the metadata files.

    `files` are the PCollections of listed images (FileBatches, Failures; or RecordBatches
    and Failures after a join) and `records` the labelled ones (RecordBatches), counted for
    summary.json; `summary_extras` PCollections of extra summary sections (small dicts, a
    side input: a few per run), merged in key order (summary.merge_sections).
    """

    def __init__(
        self,
        output_dir: str,
        temp_dir: str,
        compression: str,
        *,
        files: Sequence[beam.PCollection[FileBatch | RecordBatch | Failure]],
        records: beam.PCollection[RecordBatch],
        failed: beam.PCollection[Failure],
        shards: beam.PCollection[ShardResult],
        class_index: beam.PCollection[ClassIndex],
        fence: Fence,
        settings: EncodeSettings,
        max_failure_ratio: float,
        dataset_name: str,
        summary_extras: Sequence[beam.PCollection[dict]] = (),
    ):
        super().__init__()
        self._fn = FinalizeFn(
            output_dir, temp_dir, compression, fence, settings, max_failure_ratio, dataset_name
        )
        self._staging = staging_dir(temp_dir)
        self._files, self._records, self._failed = tuple(files), records, failed
        self._shards, self._class_index, self._extras = shards, class_index, tuple(summary_extras)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[dict]:
        # Lifted combiners without defaults (an empty input leaves the side inputs at theirs);
        # each input counted where it is made (a Map fused into its producer), then summed.
        counts = [
            pcoll | f"CountListed{i}" >> beam.Map(images_in).with_output_types(int)
            for i, pcoll in enumerate(self._files)
        ]
        listed_total = (
            counts
            | "AllListed" >> beam.Flatten().with_output_types(int)
            | "CountListed" >> beam.CombineGlobally(sum).without_defaults()
        )
        listed = (
            self._records
            | "CountListedPerClass"
            >> beam.CombineGlobally(SumPerKeyFn(split_class_counts)).without_defaults()
            | "ListedSide" >> beam.Map(SideDict).with_output_types(SideDict)
        )
        extras = self._extras | "AllExtras" >> beam.Flatten(pipeline=pbegin.pipeline)
        failure_counts = pvalue.AsSingleton(
            self._failed | "CountFailures" >> beam.CombineGlobally(FailureCountsFn()).without_defaults(),
            default_value=FailureCounts(),
        )
        # Written per (split, class) from a combiner, and by the same combiner the objects written
        # per (count, split, name) (ShardResult.objects: none without objects); the shard list
        # without those counts (one small ShardResult a shard: per class, a shard's counts add
        # up to the dataset's size).
        written = (
            self._shards
            | "CountWritten" >> beam.CombineGlobally(SumPerKeyFn(_written_and_objects)).without_defaults()
            | "WrittenSide" >> beam.Map(SideDict).with_output_types(SideDict)
        )
        shards = self._shards | "ShardsOnly" >> beam.Map(
            lambda s: dataclasses.replace(s, written=(), objects=())
        )
        parts = (
            self._failed
            | "KeyFailures" >> beam.Map(lambda f, c: (part_of(f, c.failed), f), failure_counts)
            | "GroupFailures" >> beam.GroupByKey()  # (part, [Failure]): ~PART_SIZE failures
            | "WriteFailureParts"
            >> beam.ParDo(WriteFailurePartsFn(self._staging, f"{self.label}/GroupFailures"))
        )  # part file paths: one per PART_SIZE failures
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Finalize"
            >> beam.ParDo(
                self._fn,
                pvalue.AsSingleton(listed_total, default_value=0),
                pvalue.AsSingleton(listed, default_value={}),
                pvalue.AsSingleton(written, default_value={}),
                failure_counts,
                pvalue.AsList(parts),
                pvalue.AsList(shards),
                pvalue.AsSingleton(self._class_index),
                pvalue.AsList(extras),
            )
        )
