"""What a user would see if boxes drifted from the pixels: filled rectangles of distinct colours at
known boxes, converted with --resize (pad, crop), --max_side and --exif_transpose on EXIF-rotated
JPEGs (all 8 orientations), each written image decoded by TensorFlow and each box's colour found
inside its written box, its edges within 1 pixel."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests.detection.helpers import write_records
from transforms.objects import Objects
from transforms.records import ClassIndex, ImageRecord

W, H = 480, 320
# (colour, box xmin, ymin, xmax, ymax in stored pixels): apart from each other and from the edges
# (a crop to a square cuts the left and right 80 pixels: the first box is cut, the last cut away).
BOXES = [
    ((255, 0, 0), (40, 30, 140, 120)),
    ((0, 255, 0), (200, 40, 300, 150)),
    ((0, 0, 255), (160, 190, 330, 290)),
    ((255, 255, 0), (360, 60, 440, 250)),
    ((255, 0, 255), (10, 200, 70, 300)),
]
CLASSES = tuple(f"c{i}" for i in range(len(BOXES)))


def _jpeg(path, orientation: int) -> None:
    img = Image.new("RGB", (W, H), (0, 0, 0))
    for colour, box in BOXES:
        img.paste(colour, box)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    img.save(path, "JPEG", quality=98, subsampling=0, exif=exif.tobytes())


def _found(image: np.ndarray, colour, box) -> tuple[int, int, int, int] | None:
    """The pixel box of `colour` around the written `box` (searched 4 px beyond it)."""
    h, w, _ = image.shape
    x0, y0, x1, y1 = (
        int(np.floor(box[0])) - 4,
        int(np.floor(box[1])) - 4,
        int(np.ceil(box[2])) + 4,
        int(np.ceil(box[3])) + 4,
    )
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    window = image[y0:y1, x0:x1].astype(int)
    near = np.abs(window - np.array(colour)).max(axis=2) < 100  # past half-way from black
    rows, cols = np.nonzero(near)
    if not len(rows):
        return None
    return x0 + cols.min(), y0 + rows.min(), x0 + cols.max() + 1, y0 + rows.max() + 1


OPTIONS = {
    "pad": dict(resize=(200, 200), resize_mode="pad"),
    "crop": dict(resize=(200, 200), resize_mode="crop"),
    "stretch": dict(resize=(150, 250), resize_mode="stretch"),
    "max_side": dict(max_side=101),
}


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_box_colour_is_inside_its_written_box(tmp_path, option, orientation):
    path = tmp_path / "boxes.jpg"
    _jpeg(path, orientation)
    objects = Objects.build(CLASSES, [box for _, box in BOXES], declared_size=(W, H))
    record = ImageRecord(str(path), "boxes.jpg", path.stat().st_size, (), "train", (), objects)
    settings = dict(schema="odapi", exif_transpose=True, invalid_boxes="fail", **OPTIONS[option])
    outcome, summary, shard = write_records(tmp_path / "out", [record], ClassIndex(CLASSES, 1), **settings)
    assert outcome.failures == ()
    (raw,) = list(tf.data.TFRecordDataset(str(shard)))
    f = tf.train.Example.FromString(raw.numpy()).features.feature
    image = np.asarray(Image.open(io.BytesIO(f["image/encoded"].bytes_list.value[0])).convert("RGB"))
    h, w, _ = image.shape
    assert (f["image/width"].int64_list.value[0], f["image/height"].int64_list.value[0]) == (w, h)
    labels = [CLASSES.index(t.decode()) for t in f["image/object/class/text"].bytes_list.value]
    boxes = np.stack(
        [f[f"image/object/bbox/{k}"].float_list.value for k in ("xmin", "ymin", "xmax", "ymax")], 1
    )
    written = boxes * [w, h, w, h]
    cut = summary["objects"]["boxes"]
    assert len(labels) + cut.get("cropped_out", 0) == len(BOXES)
    if option == "crop":  # the square crop cuts the long side: some boxes are cut or cut away
        assert cut.get("crop", 0) + cut.get("cropped_out", 0) > 0
    for i, box in zip(labels, written):
        colour = BOXES[i][0]
        found = _found(image, colour, box)
        assert found is not None, (CLASSES[i], box)
        np.testing.assert_allclose(
            found, box, atol=1.0, err_msg=f"{CLASSES[i]} {option} orientation {orientation}"
        )
    for i in set(range(len(BOXES))) - set(labels):  # a box cut away: its colour is not in the image
        assert not (np.abs(image.astype(int) - np.array(BOXES[i][0])).max(axis=2) < 60).any()
