"""Detection records as the detectors read them: written by the writer (records carrying Objects),
decoded by the Model Garden's TfExampleDecoder (with and without masks) and by TFDS's
builder_from_directory; boxes, classes, crowd flags, areas and masks equal the annotations."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as coco_mask

from tests.detection import model_garden
from tests.detection.helpers import write_records
from transforms.objects import Objects, mask_json
from transforms.records import ClassIndex, ImageRecord

W, H = 64, 48
CLASSES = ("cat", "dog", "person")


def _png(path: Path, size=(W, H), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def _annotations() -> Objects:
    polygon = [[2, 3, 30, 3, 30, 20, 2, 20]]
    grid = np.zeros((H, W), np.uint8, order="F")
    grid[25:40, 35:60] = 1
    compressed = coco_mask.encode(np.asfortranarray(grid))
    rle_text = {"size": [H, W], "counts": compressed["counts"].decode("ascii")}
    uncompressed = {"size": [H, W], "counts": [5 * H + 10, 8, H - 8, 8, (W - 7) * H - 18]}
    return Objects.build(
        ["cat", "dog", "person"],
        [[2, 3, 30, 20], [35, 25, 60, 40], [5, 10, 7, 18]],
        is_crowd=[False, False, True],
        difficult=[False, True, False],
        area=[476.0, np.nan, 16.0],
        masks=[mask_json(polygon), mask_json(rle_text), mask_json(uncompressed)],
        declared_size=(W, H),
    )


def _expected_masks(objects: Objects) -> list[np.ndarray]:
    """What pycocotools itself decodes each annotation to."""
    import json

    out = []
    for m in objects.masks:
        seg = json.loads(m)
        if isinstance(seg, list):
            rle = coco_mask.merge(coco_mask.frPyObjects(seg, H, W))
        elif isinstance(seg["counts"], list):
            rle = coco_mask.frPyObjects(seg, H, W)
        else:
            rle = {"size": seg["size"], "counts": seg["counts"].encode()}
        out.append(coco_mask.decode(rle))
    return out


@pytest.fixture
def written(tmp_path):
    objects = _annotations()
    records = [
        ImageRecord(str(_png(tmp_path / "a.png")), "a.png", 100, (), "train", (), objects),
        ImageRecord(
            str(_png(tmp_path / "b.png", seed=1)), "b.png", 100, (), "train", (), Objects.empty((W, H))
        ),
    ]
    out = tmp_path / "out"
    outcome, summary, shard = write_records(out, records, ClassIndex(CLASSES, 1), schema="odapi", masks=True)
    assert outcome.failures == ()
    return objects, summary, shard


@pytest.mark.parametrize("include_mask", [False, True])
def test_model_garden_decodes_the_annotations(written, include_mask, tmp_path):
    objects, summary, shard = written
    decoded = model_garden.decode([str(shard)], include_mask, tmp_path / "mg.npz")
    assert len(decoded) == 2
    first, background = decoded
    expected = objects.boxes / np.array([W, H, W, H])
    np.testing.assert_allclose(first["groundtruth_boxes"], expected[:, [1, 0, 3, 2]], atol=1e-6)
    assert first["groundtruth_classes"].tolist() == [1, 2, 3]
    assert first["groundtruth_is_crowd"].tolist() == [False, False, True]
    assert (int(first["height"]), int(first["width"])) == (H, W)
    assert first["source_id"] == b"a.png"
    masks = _expected_masks(objects)
    # The area: the annotation's, or (absent) the mask's pixel count.
    np.testing.assert_allclose(first["groundtruth_area"], [476.0, masks[1].sum(), 16.0])
    assert background["groundtruth_boxes"].shape == (0, 4)
    if include_mask:
        got = first["groundtruth_instance_masks"]
        assert got.shape == (3, H, W)
        for i, want in enumerate(masks):
            np.testing.assert_array_equal(got[i], want.astype(np.float32))  # pixel-exact
        assert background["groundtruth_instance_masks"].shape[0] == 0
    assert summary["objects"]["objects"] == 3 and summary["objects"]["background_images"] == 1
    assert summary["objects"]["splits"]["train"]["classes"] == {"cat": 1, "dog": 1, "person": 1}


def test_tfds_builder_from_directory_decodes_the_objects_and_class_map(tmp_path):
    import tensorflow_datasets as tfds

    objects = _annotations()
    class_map = np.zeros((H, W), np.uint8)
    class_map[10:20, 5:25] = 2
    class_map[0, :] = 255
    map_path = tmp_path / "a_map.png"
    Image.fromarray(class_map).save(map_path)
    with_map = Objects.build(
        objects.labels,
        objects.boxes,
        is_crowd=objects.is_crowd,
        area=objects.area,
        segmentation_path=str(map_path),
    )
    records = [ImageRecord(str(_png(tmp_path / "a.png")), "a.png", 100, (), "train", (), with_map)]
    out = tmp_path / "out"
    outcome, summary, _ = write_records(out, records, ClassIndex(CLASSES, 0), schema="tfds")
    assert outcome.failures == () and summary["objects"]["class_maps"] == 1
    builder = tfds.builder_from_directory(str(out))
    (example,) = list(builder.as_dataset(split="train").as_numpy_iterator())
    expected = objects.boxes / np.array([W, H, W, H])
    np.testing.assert_allclose(example["objects"]["bbox"], expected[:, [1, 0, 3, 2]], atol=1e-6)
    assert example["objects"]["label"].tolist() == [0, 1, 2]
    assert builder.info.features["objects"]["label"].names == list(CLASSES)
    assert example["objects"]["is_crowd"].tolist() == [False, False, True]
    assert example["objects"]["area"].tolist()[0] == 476
    np.testing.assert_array_equal(example["segmentation_mask"][..., 0], class_map)
    assert example["image"].shape == (H, W, 3)


def test_an_odapi_class_map_is_a_png_of_the_image_size(tmp_path):
    import tensorflow as tf

    class_map = (np.arange(H * W).reshape(H, W) % 21).astype(np.uint8)
    map_path = tmp_path / "m.png"
    Image.fromarray(class_map).convert("P").save(map_path)  # palette indices are the class ids
    records = [
        ImageRecord(
            str(_png(tmp_path / "a.png")),
            "a.png",
            1,
            (),
            "train",
            (),
            Objects.empty(segmentation_path=str(map_path)),
        )
    ]
    _, summary, shard = write_records(tmp_path / "out", records, ClassIndex(CLASSES, 1), schema="odapi")
    (raw,) = list(tf.data.TFRecordDataset(str(shard)))
    features = tf.train.Example.FromString(raw.numpy()).features.feature
    assert features["image/segmentation/class/format"].bytes_list.value == [b"png"]
    got = np.asarray(Image.open(io.BytesIO(features["image/segmentation/class/encoded"].bytes_list.value[0])))
    np.testing.assert_array_equal(got, class_map)
