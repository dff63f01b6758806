"""Reading a dataset of objects back with our own readers: load_dataset gives the boxes (one row
per object), masks and class maps; verify checks every box and mask; both from summary.json."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from beam_pipeline.readers.dataset import load_dataset, parse_spec
from tests.detection.helpers import write_records
from tests.detection.test_decoders import CLASSES, H, W, _annotations, _expected_masks, _png
from transforms.encoding.dataset_format import DatasetFormat
from transforms.encoding.example import serialize_example_chunks
from transforms.objects import Objects
from transforms.records import ClassIndex, ImageRecord
from transforms.verify.shards import check_shard


def _dataset(tmp_path, schema="odapi", masks=True):
    objects = _annotations()
    class_map = np.full((H, W), 3, np.uint8)
    map_path = tmp_path / "map.png"
    Image.fromarray(class_map).save(map_path)
    records = [
        ImageRecord(str(_png(tmp_path / "a.png")), "a.png", 1, (), "train", (), objects),
        ImageRecord(
            str(_png(tmp_path / "b.png", seed=2)),
            "b.png",
            1,
            (),
            "train",
            (),
            Objects.empty(segmentation_path=str(map_path)),
        ),
    ]
    out = tmp_path / "out"
    offset = 1 if schema == "odapi" else 0
    outcome, summary, shard = write_records(
        out, records, ClassIndex(CLASSES, offset), schema=schema, masks=masks
    )
    assert outcome.failures == ()
    return out, objects, summary, shard


def test_load_dataset_gives_boxes_masks_and_class_maps(tmp_path):
    out, objects, _, _ = _dataset(tmp_path)
    (image, first), (_, second) = list(load_dataset(str(out)).as_numpy_iterator())
    assert image.shape == (H, W, 3)
    expected = (objects.boxes / [W, H, W, H])[:, [1, 0, 3, 2]]
    np.testing.assert_allclose(first["boxes"], expected, atol=1e-6)
    assert first["classes"].tolist() == [1, 2, 3] and first["is_crowd"].tolist() == [False, False, True]
    for got, want in zip(first["masks"], _expected_masks(objects)):
        np.testing.assert_array_equal(got, want)
    assert (first["class_map"] == 255).all()  # no map: all "ignore"
    assert second["boxes"].shape == (0, 4) and second["masks"].shape == (0, H, W)
    assert (second["class_map"] == 3).all()
    assert "image/object/bbox/xmin" in parse_spec(str(out))
    batched = next(iter(load_dataset(str(out), batch_size=2, image_size=(8, 8))))
    assert batched[1]["boxes"].shape[0] == 2  # ragged: one row per object


def test_tfds_objects_read_back_too(tmp_path):
    out, objects, _, _ = _dataset(tmp_path, schema="tfds", masks=False)
    (_, first), _ = list(load_dataset(str(out)).as_numpy_iterator())
    np.testing.assert_allclose(first["boxes"], (objects.boxes / [W, H, W, H])[:, [1, 0, 3, 2]], atol=1e-6)
    assert first["classes"].tolist() == [0, 1, 2]


def test_a_classification_dataset_has_no_object_keys():
    assert not any("object" in key for key in parse_spec("odapi"))


def test_verify_checks_every_box_and_mask(tmp_path):
    out, _, summary, shard = _dataset(tmp_path)
    fmt = DatasetFormat.from_summary(summary)
    check = check_shard(str(shard), fmt, list(CLASSES), 1)
    assert check.ok, check.error
    # A record with a box past the image's edge, and one whose mask is not of the image's size.
    schema = fmt.schema
    good = json.loads(json.dumps({"xmin": [0.1], "ymin": [0.1], "xmax": [0.5], "ymax": [0.5]}))
    for bad, reason in (
        ({**good, "xmax": [1.5]}, "not within [0, 1]"),
        ({**good, "mask": "small"}, "mask 0 is 2x2"),
    ):
        features = {
            "image/encoded": (tmp_path / "a.png").read_bytes(),
            "image/format": "png",
            "image/filename": "a.png",
            "image/source_id": "a.png",
            "image/key/sha256": "0" * 64,
            "image/height": H,
            "image/width": W,
            "image/class/label": [],
            "image/class/text": [],
            "image/object/class/label": [1],
            **{f"image/object/bbox/{k}": bad[k] for k in ("xmin", "ymin", "xmax", "ymax")},
        }
        import io

        buf = io.BytesIO()
        Image.new("L", (2, 2) if bad.get("mask") else (W, H)).save(buf, "PNG")
        features["image/object/mask"] = [buf.getvalue()]
        from tests.conftest import frame_record

        path = tmp_path / f"bad-{reason[:4]}.tfrecord"
        path.write_bytes(frame_record(b"".join(serialize_example_chunks(features, schema.kinds))))
        check = check_shard(str(path), fmt, list(CLASSES), 1)
        assert not check.ok and reason in check.error, check.error
