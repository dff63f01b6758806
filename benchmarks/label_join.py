"""Throughput of the labels-table join: ReadLabels + JoinLabels on N generated rows.

Writes a CSV of N rows (plus 1% orphan rows, or --orphans of them), generates N image
listings inside the pipeline (no image files: the join only sees metadata; FileBatches, as
ListImages emits them) and joins them on the local runner. Prints the table's rows/s (wall)
and the pipeline's CPU time (every thread of the process: the steadier figure on a shared
machine), and checks the join's counts (every image matched once, every orphan written to
orphan_labels.jsonl, as the pipeline writes it).

    python benchmarks/label_join.py --rows 1000000 --mode in_memory

Note: with `--mode multi_threading` (the FnApiRunner's threaded mode) Beam 2.77 was seen to
corrupt or lose elements of large shuffles (from ~30,000 elements on; the count check then
fails or the job dies with "Error decoding input stream"); `in_memory` and
`multi_processing` gave correct counts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.pipeline import register_coders
from transforms.batching import CountImagesFn
from transforms.labels.beam_table import JoinLabels, ReadLabels, WriteOrphans
from transforms.labels.rows import ORPHANS, ORPHANS_FILE, STATS, JoinSettings, TableSpec
from transforms.records import BATCH_SIZE, FileBatch


def write_table(path: str, rows: int, orphans: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,landmark_id\n")
        for i in range(rows):
            f.write(f"IMG_{i:08d},{i % 1049}\n")
        for i in range(orphans):
            f.write(f"ORPHAN_{i:08d},1\n")


def listed_batch(start: int, rows: int) -> FileBatch:
    """Images start.. as ListImages emits them: a FileBatch of up to BATCH_SIZE, each
    `/data/서울/<class>/IMG_<i>.JPG` (made a column at a time: the generator stands in for
    the listing and should cost little of the measured time)."""
    ids = range(start, min(start + BATCH_SIZE, rows))
    relpaths = [f"서울/{i % 1049}/IMG_{i:08d}.JPG" for i in ids]
    paths = ["/data/" + r for r in relpaths]
    return FileBatch.from_columns(paths, relpaths, [100_000] * len(relpaths))


def check_stats(stats: list[tuple[str, int]], expected: dict[str, int]) -> None:
    got = dict(stats)
    print("stats:", dict(sorted(got.items())))
    if got != expected:
        raise AssertionError(f"join counts are wrong: expected {expected}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--mode", choices=("in_memory", "multi_threading", "multi_processing"), default="in_memory"
    )
    parser.add_argument(
        "--orphans", type=int, default=None, help="orphan rows added to the table (default: 1%% of --rows)"
    )
    args = parser.parse_args()
    orphans = args.rows // 100 if args.orphans is None else args.orphans
    with tempfile.TemporaryDirectory() as tmp:
        table = os.path.join(tmp, "train.csv")
        write_table(table, args.rows, orphans)
        spec = TableSpec(path=table, format="csv", label_column="landmark_id")
        options = PipelineOptions(
            runner="FnApiRunner", direct_num_workers=args.workers, direct_running_mode=args.mode
        )
        register_coders()  # as build_pipeline does: our coders, not pickle
        start, cpu = time.perf_counter(), time.process_time()
        with beam.Pipeline(options=options) as p:
            rows = p | "ReadLabels" >> ReadLabels(spec)
            files = (
                p
                | beam.Impulse()
                | "Generate" >> beam.FlatMap(lambda _: range(0, args.rows, BATCH_SIZE))
                | beam.Reshuffle()
                | "ToFileBatch" >> beam.Map(listed_batch, args.rows).with_output_types(FileBatch)
            )
            joined = (files, rows) | "JoinLabels" >> JoinLabels("stem", JoinSettings())
            expected = {"rows": args.rows + orphans, "matched_rows": args.rows, "orphan_rows": orphans}
            # As the pipeline does with them: listed images counted, orphan_labels.jsonl written.
            _ = joined.listed | "CountListed" >> beam.CombineGlobally(CountImagesFn())
            _ = {ORPHANS: joined.orphans, STATS: joined.stats} | "WriteOrphans" >> WriteOrphans(
                tmp, spec, JoinSettings()
            )
            _ = (
                joined.stats
                | beam.CombinePerKey(sum)
                | beam.combiners.ToList()
                | beam.Map(check_stats, expected)
            )
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        with open(os.path.join(tmp, ORPHANS_FILE), encoding="utf-8") as f:
            written = sum(1 for _ in f)
        if written != orphans:
            raise AssertionError(f"{written} orphan lines written, expected {orphans}")
    table_rows = args.rows + orphans
    print(
        f"rows={table_rows} images={args.rows} seconds={seconds:.1f} cpu={cpu:.1f} "
        f"rows_per_second={table_rows / seconds:,.0f}"
    )


if __name__ == "__main__":
    main()
