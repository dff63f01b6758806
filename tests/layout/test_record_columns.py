"""Columnar record batches, their coders, the seeded hash column and side inputs sized without a walk."""

import hashlib

import apache_beam as beam
import numpy as np
from apache_beam.runners.worker import statecache
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.layout.reference import seeded_hashes, split_for_key
from transforms import coders
from transforms.layout import plan
from transforms.layout.beam import AssignSplits, PlanShards
from transforms.layout.plan import parse_split_ratios, shuffle_order, with_hashes
from transforms.records import BATCH_SIZE, HASH_BYTES, FileBatch, ImageFile, ImageRecord, RecordBatch

RECORDS = (
    ImageRecord("/in/cat/1.jpg", "cat/1.jpg", 10, ("cat",), "train", (("source", "web"),)),
    ImageRecord("/in/b/2.png", "b/2.png", 20, ("a", "b"), "test"),
    ImageRecord("/in/x/\udcff.jpg", "x/\udcff.jpg", 30, ("x",)),  # undecodable name: surrogates
)


def test_record_batch_columns_and_records_agree():
    batch = RecordBatch(RECORDS)
    assert len(batch) == 3 and batch.records == RECORDS
    assert batch.columns() == tuple(
        zip(*((r.path, r.relpath, r.size, r.labels, r.split, r.extras) for r in RECORDS))
    )
    same = RecordBatch.from_columns(*batch.columns())
    assert same._records is None  # no ImageRecord built until asked for
    assert same == batch and same.records == RECORDS
    assert batch.class_keys() == ["cat", "a|b", "x"]
    picked = batch.take([2, 0])
    assert picked.records == (RECORDS[2], RECORDS[0])
    assert RecordBatch.concat([picked, batch.slice(1, 2)]).records == (RECORDS[2], RECORDS[0], RECORDS[1])
    assert batch.with_columns(splits=("a", "b", "c")).records[2].split == "c"


def test_file_batch_columns():
    files = tuple(ImageFile(f"/in/c/{i}.jpg", f"c/{i}.jpg", i) for i in range(4))
    batch = FileBatch(files)
    assert batch.columns() == (tuple(f.path for f in files), tuple(f.relpath for f in files), (0, 1, 2, 3))
    made = FileBatch.from_columns(*batch.columns())
    assert made == batch and made.files == files and len(made) == 4


def test_batches_round_trip_through_their_coders_with_hashes_and_surrogates():
    hashed = with_hashes(RecordBatch(RECORDS), 7)
    assert len(hashed.hashes) == 3 * HASH_BYTES and hashed.hash_seed == 7
    for batch in (hashed, RecordBatch(RECORDS[:2]), RecordBatch(())):
        back = coders.decode_record_batch(coders.encode_record_batch(batch))
        assert back == batch and back.records == batch.records
        assert (back.hashes, back.hash_seed) == (batch.hashes, batch.hash_seed)
    # Coded as columns by the primitive coder (tag byte 0), unless a name has surrogates.
    assert coders.encode_record_batch(RecordBatch(RECORDS[:2]))[:1] == b"\x00"
    files = FileBatch(tuple(ImageFile(r.path, r.relpath, r.size) for r in RECORDS))
    assert coders.decode_file_batch(coders.encode_file_batch(files)) == files


def test_one_seeded_hash_per_record_gives_split_and_shuffle_hashes():
    # sha256 over (seed, NUL, relpath): the same bytes on every platform and Python.
    digest = hashlib.sha256(b"5\0cat/1.jpg").digest()
    assert plan.record_hashes(["cat/1.jpg"], 5) == digest[:16]
    split_hash, shuffle_hash = seeded_hashes("cat/1.jpg", 5)
    assert split_hash == int.from_bytes(digest[:8], "big") and shuffle_hash == int.from_bytes(
        digest[8:16], "big"
    )
    batch = with_hashes(RecordBatch(RECORDS), 5)
    splits, shuffles = plan.hash_columns(batch.hashes)
    assert splits.dtype == np.uint64 and shuffles.tolist()[0] == shuffle_hash
    assert [RECORDS[i] for i in shuffle_order(batch)] == sorted(
        RECORDS, key=lambda r: (seeded_hashes(r.relpath, 5)[1], r.relpath)
    )
    assert with_hashes(batch, 5) is batch  # computed once: a batch that has them keeps them
    assert with_hashes(batch, 6).hashes != batch.hashes  # another seed, other hashes


def test_layout_hashes_records_once_and_plan_keeps_them():
    records = [
        ImageRecord(f"/in/c{i % 3}/{i}.jpg", f"c{i % 3}/{i}.jpg", 100 + i, (f"c{i % 3}",)) for i in range(50)
    ]
    ratios = parse_split_ratios("train=0.6,test=0.4")
    with TestPipeline() as p:
        split = (
            p | beam.Create([RecordBatch(records[:20]), RecordBatch(records[20:])]) | AssignSplits(ratios, 3)
        )
        assert_that(
            split | beam.Map(lambda b: (b.hash_seed, b.hashes == plan.record_hashes(b.relpaths, 3))),
            equal_to([(3, True), (3, True)]),
        )
        assert_that(
            split | "Splits" >> beam.FlatMap(lambda b: [(r.relpath, r.split) for r in b.records]),
            equal_to([(r.relpath, split_for_key(r.relpath, 3, ratios)) for r in records]),
            label="SplitsOfTheHash",
        )
        tasks = split | PlanShards(3, None, 2)
        assert_that(
            tasks | beam.Map(lambda t: len(t.records) <= BATCH_SIZE and t.split in ("train", "test")),
            equal_to([True] * 4),
            label="Tasks",
        )


def test_side_dicts_are_sized_without_walking_their_entries():
    big = {f"class-{i}": [i, i] for i in range(20_000)}
    walked = statecache.get_deep_size(big)
    side = coders.SideDict(big)
    assert statecache.get_deep_size(side) < walked / 3  # the table alone, not 60,000 objects
    coder = coders.SideDictCoder()
    back = coder.decode(coder.encode(side))
    assert type(back) is coders.SideDict and back == big
    names = coders.SideList(sorted(big))
    assert coders.SideListCoder().decode(coders.SideListCoder().encode(names)) == sorted(big)
