"""transforms/objects.py: the Objects record round-trips through its bytes, deterministically, and
rides on a RecordBatch (an `objects` column) through its coder and cuts."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from transforms import coders
from transforms.layout.plan import with_hashes
from transforms.objects import Objects, mask_json
from transforms.records import ImageRecord, RecordBatch, ShardTask


def _sample() -> Objects:
    return Objects.build(
        ["cat", "dog", "naïve \udcff", ""],
        [[0, 0, 10, 10], [1.5, 2.25, 3.0, 4.0], [math.nan, 0, 1, 1], [5, 6, 7, 8]],
        is_crowd=[False, True, False, False],
        difficult=[True, False, False, True],
        truncated=[False, False, True, False],
        area=[100.0, math.nan, 3.0, 4.0],
        masks=[mask_json([[0, 0, 10, 0, 10, 10]]), None, b"", mask_json({"size": [4, 5], "counts": "abc"})],
        declared_size=(640, 480),
        segmentation_path="maps/a \udcfe.png",
    )


def test_round_trip_keeps_every_field():
    objects = _sample()
    back = Objects.from_bytes(objects.to_bytes())
    assert back.labels == objects.labels
    np.testing.assert_array_equal(back.boxes, objects.boxes)
    assert back.boxes.dtype == np.float64 and back.boxes.shape == (4, 4)
    for name in ("is_crowd", "difficult", "truncated"):
        assert getattr(back, name).dtype == bool
        np.testing.assert_array_equal(getattr(back, name), getattr(objects, name))
    np.testing.assert_array_equal(back.area, objects.area)  # NaN where absent, equal as NaN
    assert back.masks == objects.masks
    assert back.declared_size == (640, 480) and back.segmentation_path == "maps/a \udcfe.png"
    assert back.normalized is False
    assert back == objects and hash(back) == hash(objects)
    assert pickle.loads(pickle.dumps(objects)) == objects


def test_bytes_are_deterministic_and_differ_with_content():
    a, b = _sample(), _sample()
    assert a.to_bytes() == b.to_bytes()
    # Another NaN payload is the same absent area.
    weird_nan = np.frombuffer(np.uint64(0x7FF8000000000123).tobytes(), dtype=np.float64)[0]
    c = Objects.build(["x"], [[0, 0, 1, 1]], area=[weird_nan])
    assert c.to_bytes() == Objects.build(["x"], [[0, 0, 1, 1]]).to_bytes()
    assert Objects.build(["x"], [[0, 0, 1, 1]], normalized=True) != Objects.build(["x"], [[0, 0, 1, 1]])
    assert Objects.build(["x"], [[0, 0, 1, 2]]) != Objects.build(["x"], [[0, 0, 1, 1]])
    assert Objects.build(["x"], [[0, 0, 1, 1]], masks=[b""]) != Objects.build(["x"], [[0, 0, 1, 1]])


def test_empty_is_a_background_image():
    empty = Objects.empty(declared_size=(3, 2))
    assert len(empty) == 0 and empty.boxes.shape == (0, 4)
    back = Objects.from_bytes(empty.to_bytes())
    assert back == empty and back.declared_size == (3, 2) and back.segmentation_path is None
    assert Objects.from_bytes(Objects.empty().to_bytes()).declared_size is None


def test_many_objects_pack_their_flags():
    n = 1000
    rng = np.random.default_rng(0)
    flags = rng.random((3, n)) < 0.5
    objects = Objects.build(
        [f"c{i % 7}" for i in range(n)],
        rng.random((n, 4)),
        is_crowd=flags[0],
        difficult=flags[1],
        truncated=flags[2],
    )
    back = Objects.from_bytes(objects.to_bytes())
    np.testing.assert_array_equal(np.stack([back.is_crowd, back.difficult, back.truncated]), flags)
    assert back == objects


def test_columns_of_other_lengths_are_refused():
    with pytest.raises(ValueError, match="is_crowd has 1 entries for 2 labels"):
        Objects.build(["a", "b"], [[0, 0, 1, 1], [0, 0, 1, 1]], is_crowd=[True])
    with pytest.raises(ValueError, match="boxes"):
        Objects.build(["a", "b"], [[0, 0, 1, 1]])


def test_arrays_are_frozen_and_the_callers_are_not():
    boxes = np.array([[0.0, 0, 1, 1]])
    objects = Objects.build(["a"], boxes)
    boxes[0, 0] = 5  # the caller's array stays writable, and the record does not see the change
    assert objects.boxes[0, 0] == 0
    with pytest.raises(ValueError):
        objects.boxes[0, 0] = 1


def test_take_keeps_the_chosen_objects():
    objects = _sample()
    kept = objects.take(np.array([True, False, False, True]))
    assert kept.labels == ("cat", "")
    assert kept.masks == (objects.masks[0], objects.masks[3])
    assert kept.declared_size == (640, 480)
    assert objects.take([]) == Objects.build(
        (), np.zeros((0, 4)), declared_size=(640, 480), segmentation_path=objects.segmentation_path
    )


def test_cut_or_foreign_bytes_are_refused():
    data = _sample().to_bytes()
    with pytest.raises(ValueError, match="cut short"):
        Objects.from_bytes(data[:-3])
    with pytest.raises(ValueError, match="trailing"):
        Objects.from_bytes(data + b"x")
    with pytest.raises(ValueError, match="version"):
        Objects.from_bytes(b"\x09" + data[1:])


# --- the objects column of a RecordBatch (transforms/records.py, transforms/coders.py) ---


def _records() -> tuple[ImageRecord, ...]:
    return (
        ImageRecord("/in/a.jpg", "a.jpg", 10, ("",), "train", (), _sample()),
        ImageRecord("/in/b.jpg", "b.jpg", 20, ("",), "train", (), Objects.empty((4, 3))),
        ImageRecord("/in/c.jpg", "c.jpg", 30, ("",), "test", (), None),
        ImageRecord("/in/d.jpg", "d.jpg", 40, ("",), "train", (), Objects.build(["cat"], [[1, 2, 3, 4]])),
    )


def test_a_batch_carries_each_records_objects_through_its_coder_and_cuts():
    records = _records()
    batch = with_hashes(RecordBatch(records), 7)
    assert batch.objects == tuple(r.objects for r in records)
    back = coders.decode_record_batch(coders.encode_record_batch(batch))
    assert back == batch and back.records == records and back.objects[2] is None
    assert back.take([3, 0]).records == (records[3], records[0])
    assert back.slice(1, 3).objects == (records[1].objects, None)
    plain = RecordBatch([ImageRecord("/in/e.jpg", "e.jpg", 1, ("x",))])
    joined = RecordBatch.concat([plain, back.slice(0, 1)])
    assert joined.objects == (None, records[0].objects)
    assert RecordBatch.concat([plain, plain]).objects is None
    assert back.with_columns(splits=("x",) * 4).objects == batch.objects
    assert back != back.with_columns(objects=None) and hash(back) != hash(back.with_columns(objects=None))
    built = RecordBatch.from_columns(*batch.columns(), objects=[r.objects for r in records])
    assert built.records == records
    task = ShardTask("train", 0, back)
    assert coders.decode_shard_task(coders.encode_shard_task(task)).records == records
    assert list(task.iter_records()) == list(records)
    for record in records:
        assert coders.decode_image_record(coders.encode_image_record(record)) == record
    assert coders.RecordBatchCoder().estimate_size(batch) > coders.RecordBatchCoder().estimate_size(
        batch.with_columns(objects=None)
    )
    with pytest.raises(ValueError, match="objects of the wrong length"):
        RecordBatch.from_columns(*batch.columns(), objects=[None])


def test_a_classification_batch_is_coded_as_before():
    """No objects: no field is added (the coded form, and so the runner's work, is unchanged)."""
    records = tuple(ImageRecord(f"/in/{i}.jpg", f"{i}.jpg", i, ("cat",)) for i in range(5))
    batch = RecordBatch(records)
    assert batch.objects is None and len(coders.record_batch_fields(batch)) == 12
    assert coders.encode_image_record(records[0]) == coders.tagged(
        ("/in/0.jpg", "0.jpg", 0, ("cat",), "train", ()), None
    )
