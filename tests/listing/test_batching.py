"""Records in batches: boundaries, failures inside a batch, and the same splits and shards."""

import collections

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.io.filesystem import FileMetadata
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.layout.reference import plan_shards, split_for_key, stratified_splits
from transforms import progress
from transforms.batching import KeyedGather, chunked
from transforms.failures import FAILED
from transforms.labels.beam import LabelFromFolders
from transforms.layout.beam import AssignSplits, PlanShards
from transforms.layout.beam_prescan import DropDuplicates
from transforms.layout.plan import parse_split_ratios
from transforms.layout.prescan import DEDUPE_STAGE
from transforms.listing.beam import ListImages
from transforms.listing.beam_walk import KeepImagesFn
from transforms.records import BATCH_SIZE, FileBatch, ImageFile, ImageRecord, RecordBatch


def _records(n: int, classes: int = 3) -> list[ImageRecord]:
    return [
        ImageRecord(
            f"/in/c{i % classes}/{i}.jpg",
            f"c{i % classes}/{i}.jpg",
            500 + (i * 37) % 900,
            (f"c{i % classes}",),
        )
        for i in range(n)
    ]


def test_chunked():
    assert [len(c) for c in chunked(range(2 * BATCH_SIZE + 1))] == [BATCH_SIZE, BATCH_SIZE, 1]
    assert list(chunked([])) == []


def test_listing_batches_at_the_boundaries(tmp_path):
    """An empty folder lists no batch (not an empty one); 1,000 images one; 1,001 two."""
    sizes = {"empty": 0, "one": BATCH_SIZE, "more": BATCH_SIZE + 1}
    for name, n in sizes.items():
        (tmp_path / name / "cls" / "sub").mkdir(parents=True)
        for i in range(n):  # listing needs names and sizes only
            (tmp_path / name / ("cls" if i % 2 else "cls/sub") / f"{i}.jpg").write_bytes(b"x" * (i % 5))
    (tmp_path / "more" / "cls" / "notes.txt").write_text("not an image")
    tallies = {name: progress.register(f"batching-{name}") for name in sizes}
    try:
        with TestPipeline() as p:
            for name, n in sizes.items():
                files = (
                    p | f"List{name}" >> ListImages(str(tmp_path / name), progress_key=f"batching-{name}")
                ).files
                expected = [BATCH_SIZE, 1][: -(-n // BATCH_SIZE)]
                assert_that(
                    files | f"Sizes{name}" >> beam.Map(len), equal_to(expected), label=f"CheckSizes{name}"
                )
                labeled = files | f"Label{name}" >> LabelFromFolders()
                assert_that(
                    labeled.records | f"Records{name}" >> beam.FlatMap(lambda b: [r.size for r in b.records]),
                    equal_to([i % 5 for i in range(n)]),
                    label=f"CheckRecords{name}",
                )
        assert {name: tally.snapshot()[0] for name, tally in tallies.items()} == sizes
    finally:
        for name in sizes:
            progress.unregister(f"batching-{name}")


def test_failures_inside_a_batch_are_one_failure_each():
    files = [
        ImageFile(f"/in/{rel}", rel, 1)
        for rel in ("a/1.jpg", "loose.jpg", "b\nc/2.jpg", "b\nc/3.jpg", "a/4.jpg")
    ]
    with TestPipeline() as p:
        labeled = p | beam.Create([FileBatch(tuple(files))]) | LabelFromFolders()
        assert_that(
            labeled.records | "Records" >> beam.Map(lambda b: [(r.relpath, r.labels) for r in b.records]),
            equal_to([[("a/1.jpg", ("a",)), ("a/4.jpg", ("a",))]]),
            label="CheckRecords",
        )
        assert_that(
            labeled[FAILED] | "Failed" >> beam.Map(lambda f: (f.path, f.stage, f.reason.split(" ")[0])),
            equal_to(
                [
                    ("/in/loose.jpg", "label", "not"),
                    ("/in/b\nc/2.jpg", "label", "folder"),  # a bad folder fails every image in it
                    ("/in/b\nc/3.jpg", "label", "folder"),
                ]
            ),
            label="CheckFailed",
        )


@pytest.mark.parametrize("stratify", [False, True])
def test_splits_are_the_same_whatever_the_batches(stratify):
    records = _records(2500)
    ratios = parse_split_ratios("train=0.7,validation=0.2,test=0.1")
    if stratify:
        by_class = collections.defaultdict(list)
        for r in records:
            by_class[r.class_key].append(r)
        expected = [
            (r.relpath, s) for group in by_class.values() for s, r in stratified_splits(group, 5, ratios)
        ]
    else:
        expected = [(r.relpath, split_for_key(r.relpath, 5, ratios)) for r in records]
    batches = [RecordBatch(c) for c in chunked(reversed(records), 333)]
    with TestPipeline() as p:
        out = p | beam.Create(batches) | AssignSplits(ratios, seed=5, stratify=stratify)
        assert_that(
            out | beam.FlatMap(lambda b: [(r.relpath, r.split) for r in b.records]), equal_to(expected)
        )
        assert_that(
            out | "BadSizes" >> beam.Filter(lambda b: not 0 < len(b) <= BATCH_SIZE),
            equal_to([]),
            label="Sizes",
        )


def test_same_shards_for_the_same_seed_whatever_the_batches():
    ratios = parse_split_ratios("train=0.5,test=0.5")
    records = [
        ImageRecord(r.path, r.relpath, r.size, r.labels, split_for_key(r.relpath, 1, ratios))
        for r in _records(2100)
    ]
    expected = [
        (split, i, tuple(r.relpath for r in shard))
        for split in ("test", "train")
        for i, shard in enumerate(plan_shards([r for r in records if r.split == split], 9, 40_000))
    ]
    assert len(expected) > 10
    with TestPipeline() as p:
        for name, batches in (
            ("One", [RecordBatch(tuple(records))]),  # more than BATCH_SIZE in one batch is fine
            ("Many", [RecordBatch(c) for c in chunked(reversed(records), 101)]),
        ):
            tasks = p | f"Create{name}" >> beam.Create(batches) | f"Plan{name}" >> PlanShards(9, 40_000, None)
            assert_that(
                tasks
                | f"Shape{name}"
                >> beam.Map(lambda t: (t.split, t.index, tuple(r.relpath for r in t.records))),
                equal_to(expected),
                label=f"Check{name}",
            )


def test_drop_duplicates_batches_the_kept_records_again(tmp_path):
    records = []
    for i in range(BATCH_SIZE + 30):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(b"copy" if i % 100 == 7 else f"image {i}".encode())  # 11 copies of one content
        records.append(ImageRecord(str(path), path.name, path.stat().st_size, ("c",)))
    with TestPipeline() as p:
        out = p | beam.Create([RecordBatch(c) for c in chunked(records, 400)]) | DropDuplicates()
        assert_that(
            out.records | beam.FlatMap(lambda b: [r.relpath for r in b.records]),
            equal_to([r.relpath for i, r in enumerate(records) if i % 100 != 7] + ["1007.jpg"]),
        )
        assert_that(
            out.records | "BadSizes" >> beam.Filter(lambda b: not 0 < len(b) <= BATCH_SIZE),
            equal_to([]),
            label="Sizes",
        )
        assert_that(  # batched again: a few batches, not one per image
            out.records | "Count" >> beam.combiners.Count.Globally() | beam.Map(lambda n: n <= 10),
            equal_to([True]),
            label="Batched",
        )
        assert_that(
            out.failed | beam.Map(lambda f: (f.stage, f.reason)),
            equal_to([(DEDUPE_STAGE, "duplicate of 1007.jpg")] * 10),
            label="Failed",
        )


def test_bucket_listing_batches_per_bundle_and_counts_every_image():
    """KeepImagesFn (gs:// roots, one matched file at a time): full batches, then the rest."""
    n = BATCH_SIZE + 2
    matched = [FileMetadata(f"gs://b/in/c/{i}.jpg", i) for i in range(n)] + [
        FileMetadata("gs://b/in/c/x.txt", 1)
    ]
    tally = progress.register("batching-bucket")
    try:
        with TestPipeline() as p:
            batches = p | beam.Create(matched) | beam.ParDo(KeepImagesFn("gs://b/in", "batching-bucket"))
            assert_that(
                batches | beam.FlatMap(lambda b: [(f.relpath, f.size) for f in b.files]),
                equal_to([(f"c/{i}.jpg", i) for i in range(n)]),
            )
            assert_that(
                batches | "Batched" >> beam.combiners.Count.Globally() | beam.Map(lambda c: 2 <= c <= 10),
                equal_to([True]),
                label="Count",
            )
        assert tally.snapshot()[0] == n
    finally:
        progress.unregister("batching-bucket")


def test_keyed_gather_sends_one_part_per_key_a_flush_in_arrival_order():
    def batch(start, n):
        return RecordBatch(
            tuple(ImageRecord(f"/in/{i}", f"c/{i}", i, ("c",)) for i in range(start, start + n))
        )

    def add(gather, batch, keys):
        distinct = list(dict.fromkeys(keys))
        return gather.add_coded(batch, np.array([distinct.index(k) for k in keys]), distinct)

    gather = KeyedGather(max_held=10)
    # 4 records held: nothing due; the next 6 make 10 and flush every key at once.
    assert list(add(gather, batch(0, 4), ["b", "a", "b", "a"])) == []
    flushed = list(add(gather, batch(4, 6), ["a", "c", "b", "a", "c", "c"]))
    assert [(k, [r.size for r in part.records]) for k, part in flushed] == [
        ("b", [0, 2, 6]),
        ("a", [1, 3, 4, 7]),
        ("c", [5, 8, 9]),
    ]
    assert list(gather.drain()) == []  # nothing held after a flush
    assert [(k, len(p)) for k, p in add(gather, batch(10, 3), [("s", 1)] * 3)] == []
    assert [(k, len(p)) for k, p in gather.drain()] == [(("s", 1), 3)]
