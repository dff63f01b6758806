"""encoding/objects.py: boxes checked against the real image (invalid boxes, declared sizes, unknown
categories), each outcome a named failure or a counted clip or drop."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from transforms.encoding.objects import ObjectError, prepare_objects
from transforms.images.geometry import Geometry, plan_geometry
from transforms.images.types import ImageOptions
from transforms.objects import Objects
from transforms.records import ClassIndex

INDEX = ClassIndex(("cat", "dog"), 1)
GEOMETRY = Geometry.identity(100, 50)
BAD = [
    [10, 10, 20, 20],
    [90, 10, 120, 40],
    [30, 30, 20, 40],
    [5, 5, 5, 9],
    [np.nan, 0, 1, 1],
    [200, 0, 220, 10],
]


def _bad() -> Objects:
    return Objects.build(["cat"] * len(BAD), BAD)


def test_invalid_boxes_fail_by_default_naming_the_box_and_kind():
    with pytest.raises(ObjectError, match=r"object 1: invalid box \[90, 10, 120, 40\] \(outside\)"):
        prepare_objects(_bad(), GEOMETRY, INDEX)


def test_clip_clips_what_reaches_outside_and_drops_the_rest_counted():
    out = prepare_objects(_bad(), GEOMETRY, INDEX, invalid_boxes="clip")
    np.testing.assert_allclose(out.boxes, [[0.1, 0.2, 0.2, 0.4], [0.9, 0.2, 1.0, 0.8]])
    assert dict(out.counts) == {
        "clipped/outside": 1,
        "dropped/inverted": 1,
        "dropped/empty": 1,
        "dropped/nan": 1,
        "dropped/outside": 1,
    }


def test_drop_drops_every_invalid_box_counted():
    out = prepare_objects(_bad(), GEOMETRY, INDEX, invalid_boxes="drop")
    assert len(out) == 1
    assert dict(out.counts) == {
        "dropped/outside": 2,
        "dropped/inverted": 1,
        "dropped/empty": 1,
        "dropped/nan": 1,
    }


def test_float_noise_at_the_edges_is_clamped_not_counted():
    objects = Objects.build(["cat"], [[0.1, 0.2, 0.5, 1.0000001]], normalized=True)
    out = prepare_objects(objects, GEOMETRY, INDEX)
    np.testing.assert_allclose(out.boxes, [[0.1, 0.2, 0.5, 1.0]])
    assert out.counts == ()


def test_an_unknown_category_fails_the_image():
    with pytest.raises(ObjectError, match="category 'bird' is not in the class index"):
        prepare_objects(Objects.build(["bird"], [[1, 1, 2, 2]]), GEOMETRY, INDEX)


def _rotated_jpeg(orientation: int, size=(100, 50)) -> bytes:
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.new("RGB", size).save(buf, "JPEG", exif=exif.tobytes())
    return buf.getvalue()


def test_a_declared_size_the_image_does_not_have_fails_unless_told_which_to_trust():
    data = _rotated_jpeg(6)  # stored 100x50, shown upright as 50x100
    objects = Objects.build(["cat"], [[10, 20, 30, 60]], declared_size=(50, 100))
    with pytest.raises(
        ObjectError, match=r"declares 50x100 but the image is 100x50 \(its EXIF orientation 6"
    ):
        prepare_objects(objects, GEOMETRY, INDEX, data=data)
    # annotation: the box is in the upright frame, taken back to the stored frame (rotated 90).
    upright = prepare_objects(objects, GEOMETRY, INDEX, trust_size="annotation", data=data)
    np.testing.assert_allclose(upright.boxes * [100, 50, 100, 50], [[20, 20, 60, 40]])
    # written upright (--exif_transpose): the box is where the annotator drew it.
    geometry = plan_geometry(100, 50, 6, ImageOptions(exif_transpose=True))
    shown = prepare_objects(objects, geometry, INDEX, trust_size="annotation", data=data)
    np.testing.assert_allclose(shown.boxes * [50, 100, 50, 100], [[10, 20, 30, 60]])
    # image: the boxes are the stored image's pixels as they are (here reaching past its height).
    with pytest.raises(ObjectError, match="outside"):
        prepare_objects(objects, GEOMETRY, INDEX, trust_size="image", data=data)
    clipped = prepare_objects(objects, GEOMETRY, INDEX, trust_size="image", invalid_boxes="clip", data=data)
    np.testing.assert_allclose(clipped.boxes * [100, 50, 100, 50], [[10, 20, 30, 50]])


def test_a_resized_copys_annotation_is_scaled_when_trusted():
    objects = Objects.build(["dog"], [[20, 10, 40, 20]], declared_size=(200, 100), area=[200.0])
    with pytest.raises(ObjectError, match="declares 200x100 but the image is 100x50"):
        prepare_objects(objects, GEOMETRY, INDEX)
    out = prepare_objects(objects, GEOMETRY, INDEX, trust_size="annotation")
    np.testing.assert_allclose(out.boxes, [[0.1, 0.1, 0.2, 0.2]])
    assert out.area.tolist() == [50.0] and out.ids == (2,)


def test_a_background_image_has_no_objects():
    out = prepare_objects(Objects.empty((100, 50)), GEOMETRY, INDEX)
    assert len(out) == 0 and out.boxes.shape == (0, 4)
