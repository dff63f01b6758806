"""The cheaper per-image pipeline: records in batches, record coders, counting inside listing,
lifted counts."""

from __future__ import annotations

import dataclasses
import functools

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline import main
from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.pipeline import build_pipeline, register_coders
from tests.conftest import write_image
from transforms.batching import CountImagesFn, SumPerKeyFn
from transforms.coders import (
    FileBatchCoder,
    ImageRecordCoder,
    RecordBatchCoder,
    ShardTaskCoder,
)
from transforms.failures import Failure
from transforms.labels.beam import ClassNamesFn, split_class_counts
from transforms.records import FileBatch, ImageFile, ImageRecord, RecordBatch, ShardTask

register_coders()  # as build_pipeline does

RECORDS = [
    ImageRecord("/in/cat/a.jpg", "cat/a.jpg", 1234, ("cat",)),
    ImageRecord(
        "gs://b/x/서울/b.png", "x/서울/b.png", 0, ("a", "b|c"), "test", (("w", 0.5), ("n", -3), ("s", "é"))
    ),
    ImageRecord("/in/\udcff\udcfe.jpg", "\udcff\udcfe.jpg", 2**70, (), "validation"),  # undecodable name
    ImageRecord("/in/x.jpg", "x.jpg", 7, ("1",), "train", (("big", 2**64), ("t", True))),
]


@pytest.mark.parametrize("record", RECORDS)
def test_image_record_coder_round_trips_exactly_and_deterministically(record):
    coder = coders.registry.get_coder(ImageRecord)
    assert isinstance(coder, ImageRecordCoder) and coder.is_deterministic()
    encoded = coder.encode(record)
    decoded = coder.decode(encoded)
    assert decoded == record
    assert [type(v) for _, v in decoded.extras] == [type(v) for _, v in record.extras]
    # Equal records, built separately, code to the same bytes (a deterministic coder).
    copy = ImageRecord(
        record.path, record.relpath, record.size, tuple(record.labels), record.split, record.extras
    )
    assert coder.encode(copy) == encoded
    # Nested in a shuffle's key-value coder (length-prefixed), as in PlanShards.
    kv = coders.TupleCoder([coders.StrUtf8Coder(), coder])
    assert kv.decode(kv.encode(("train", record))) == ("train", record)


def test_shard_task_coder_round_trips():
    task = ShardTask("train", 3, tuple(RECORDS))
    task_coder = coders.registry.get_coder(ShardTask)
    assert isinstance(task_coder, ShardTaskCoder)
    assert task_coder.decode(task_coder.encode(task)) == task
    empty = ShardTask("test", 0, ())
    assert task_coder.decode(task_coder.encode(empty)) == empty
    # Smaller than the pickled record it replaces.
    pickled = coders.PickleCoder().encode(RECORDS[0])
    assert len(coders.registry.get_coder(ImageRecord).encode(RECORDS[0])) < len(pickled) / 1.5


MANY = [dataclasses.replace(r, relpath=f"{r.relpath}{i}") for i in range(300) for r in RECORDS]


@pytest.mark.parametrize("records", [RECORDS, RECORDS[:2], (), MANY])
def test_batch_coders_round_trip_exactly_and_deterministically(records):
    # With a surrogate name (RECORDS[2]) the whole batch is pickled; without, one tuple call.
    batch = RecordBatch(tuple(records))
    coder = coders.registry.get_coder(RecordBatch)
    assert isinstance(coder, RecordBatchCoder) and coder.is_deterministic()
    encoded = coder.encode(batch)
    assert coder.decode(encoded) == batch
    copy = [ImageRecord(r.path, r.relpath, r.size, tuple(r.labels), r.split, r.extras) for r in records]
    assert coder.encode(RecordBatch(tuple(copy))) == encoded
    kv = coders.TupleCoder([coders.StrUtf8Coder(), coder])  # as in GroupBySplit
    assert kv.decode(kv.encode(("train", batch))) == ("train", batch)
    files = FileBatch(tuple(ImageFile(r.path, r.relpath, r.size) for r in records))
    file_coder = coders.registry.get_coder(FileBatch)
    assert isinstance(file_coder, FileBatchCoder) and file_coder.decode(file_coder.encode(files)) == files
    # The size estimate (sampled by Beam for its counters) is cheap but of the right order.
    for c, value in ((coder, batch), (file_coder, files)):
        estimate, size = c.get_impl().estimate_size(value), len(c.encode(value))
        assert size / 3 <= estimate <= size * 3 or RECORDS[2] in records or not records


def test_plan_shards_shuffles_use_the_record_coders(tmp_path):
    (tmp_path / "in" / "a").mkdir(parents=True)
    options = PipelineOptions(["--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out")])
    p = beam.Pipeline(options=options)
    build_pipeline(p, options.view_as(ConvertOptions), "run")
    proto = p.to_runner_api()
    context_coders = proto.components.coders

    def payloads(coder_id: str) -> bytes:  # the pickled Python coders, nested ones included
        spec = context_coders[coder_id]
        return spec.spec.payload + b"".join(payloads(inner) for inner in spec.component_coder_ids)

    def coder_of(step: str) -> bytes:  # the coder of the main output of `step`
        pcolls = proto.components.pcollections.values()
        return payloads(next(pc.coder_id for pc in pcolls if pc.unique_name.endswith(step + ".None")))

    assert b"RecordBatchCoder" in coder_of("PlanShards/GroupByShard")
    assert b"ShardTaskCoder" in coder_of("PlanShards/CutShards")
    assert b"FileBatchCoder" in coder_of("ListImages/WalkLocal/ParDo(WalkLocalFn)")
    assert b"FileBatchCoder" in coder_of("ListImages/IndexArchives/Index/ParDo(IndexArchivesFn)")  # members
    assert b"FileBatchCoder" in coder_of("ListImages/AllFiles")
    assert b"RecordBatchCoder" in coder_of("ParDo(LabelFromFoldersFn)")  # the main output, .records
    # The records keyed to their shard: coded as columns, never pickled (a pickled batch costs
    # ~2 us an image at every boundary). The plan's totals (a few numpy arrays) are pickled once.
    assert b"RecordBatchCoder" in coder_of("PlanShards/KeyShards")
    assert b"SideListCoder" in coder_of("BuildClassIndex/NamesSide")


def test_count_and_name_combiners_merge():
    counts, names = SumPerKeyFn(split_class_counts), ClassNamesFn()
    a = counts.add_input(counts.create_accumulator(), RecordBatch(RECORDS[:1]))
    b = counts.add_input(counts.create_accumulator(), RecordBatch((RECORDS[0], RECORDS[1])))
    assert counts.extract_output(counts.merge_accumulators([a, b, counts.create_accumulator()])) == {
        ("train", "cat"): 2,
        ("test", "a|b|c"): 1,
    }
    n = [names.add_input(names.create_accumulator(), RecordBatch((r,))) for r in RECORDS]
    assert names.extract_output(names.merge_accumulators(n)) == ["1", "a", "b|c", "cat"]
    images = CountImagesFn()
    listed = [RecordBatch(tuple(RECORDS)), Failure("/in/x.jpg", "bad", "label"), FileBatch(())]
    assert images.extract_output(functools.reduce(images.add_input, listed, images.create_accumulator())) == 5


def test_nothing_listed_inside_the_pipeline_is_a_user_error(tmp_path):
    # Every image is skipped as unlabeled: the listed count is empty, not a crash.
    write_image(tmp_path / "in" / "a" / "x.jpg")
    table = tmp_path / "labels.csv"
    table.write_text("id,label\nother,cat\n")
    with pytest.raises(main.UserError, match="holds no image files"):
        main.run(
            [
                "--input",
                str(tmp_path / "in"),
                "--output_dir",
                str(tmp_path / "out"),
                "--labels",
                str(table),
                "--unlabeled",
                "skip",
                "--quiet",
            ],
            save_main_session=False,
        )
