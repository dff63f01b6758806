"""transforms/objects.py: the Objects record round-trips through its bytes, deterministically."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from transforms.objects import Objects, mask_json


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
