"""`inspect` of a dataset with objects: objects per split and class, COCO sizes and images without
objects, counted from the records (and equal to what the Model Garden's decoder and TFDS decode
from them); the report draws each sample's boxes, class names, masks and class map (checked in
the page's SVG, and in a real Chromium's screenshot)."""

from __future__ import annotations

import collections
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_pipeline import main
from beam_pipeline.readers import drawing
from beam_pipeline.readers import inspect as inspection
from tests.conftest import chromium_screenshot
from tests.detection import model_garden
from tests.detection.helpers import write_records, write_splits
from transforms.objects import Objects, mask_json
from transforms.records import ClassIndex, ImageRecord
from transforms.verify.shards import SampleObjects

W, H = 200, 100  # drawn at 256 x 128 in the report (OBJECT_THUMBNAIL_PX on the longest side)
TEAL = (0, 160, 160)
CLASSES = ("cat", "dog", "person")
CAT_BOX = (40, 20, 120, 70)
CAT_MASK = (60, 30, 100, 60)  # a rectangle inside the cat's box


def _image(path: Path, colour=TEAL) -> str:
    Image.new("RGB", (W, H), colour).save(path)
    return str(path)


def _rect(x0, y0, x1, y1) -> bytes:
    return mask_json([[x0, y0, x1, y0, x1, y1, x0, y1]])


def _objects(labels, boxes, areas, masks: bool, segmentation_path=None) -> Objects:
    """Objects with explicit areas (so each COCO size is known) and, with `masks`, a mask each."""
    return Objects.build(
        labels,
        boxes,
        area=areas,
        masks=[_rect(*CAT_MASK if tuple(box) == CAT_BOX else box) for box in boxes] if masks else None,
        segmentation_path=segmentation_path,
    )


def _dataset(root: Path, schema: str) -> tuple[Path, dict]:
    """Two splits: train holds a (cat: medium, dog: small), b (no objects) and c (dog: small,
    person: large, and with odapi a class map); test holds d (cat: small) and e (no objects).
    With tfds neither masks (an odapi key) nor a class map (TFDS cannot read a split where some
    records have none: its Image feature is required)."""
    masks = schema == "odapi"
    class_map = np.zeros((H, W), np.uint8)
    class_map[50:90, 20:180] = 2
    class_map[0:5, :] = 255
    Image.fromarray(class_map).save(root / "c_map.png")
    annotations = {
        "a.png": ("train", _objects(["cat", "dog"], [CAT_BOX, (130, 40, 190, 90)], [4000, 500], masks)),
        "b.png": ("train", Objects.empty()),
        "c.png": (
            "train",
            _objects(
                ["dog", "person"],
                [(10, 10, 30, 30), (0, 0, 200, 100)],
                [400, 20000],
                masks,
                str(root / "c_map.png") if masks else None,
            ),
        ),
        "d.png": ("test", _objects(["cat"], [(150, 10, 160, 20)], [100], masks)),
        "e.png": ("test", Objects.empty()),
    }
    records = [
        ImageRecord(_image(root / name), name, 100, (), split, (), objects)
        for name, (split, objects) in annotations.items()
    ]
    out = root / f"out-{schema}"
    offset = 1 if schema == "odapi" else 0
    outcomes, summary, shards = write_splits(
        out, records, ClassIndex(CLASSES, offset), schema=schema, masks=masks
    )
    assert all(o.failures == () for o in outcomes.values())
    return out, shards


# What the annotations above hold: split -> class -> COCO size -> objects; split -> images without.
EXPECTED = {
    "test": {"cat": {"small": 1}},
    "train": {"cat": {"medium": 1}, "dog": {"small": 2}, "person": {"large": 1}},
}
BACKGROUND = {"train": 1, "test": 1}


@pytest.fixture(scope="module", params=["odapi", "tfds"])
def written(request, tmp_path_factory) -> tuple[str, Path, dict]:
    root = tmp_path_factory.mktemp(f"inspect-{request.param}")
    out, shards = _dataset(root, request.param)
    return request.param, out, shards


def _counted(stats: inspection.DatasetStats) -> dict:
    return {
        split: {cls: dict(sizes) for cls, sizes in classes.items()}
        for split, classes in stats.objects.items()
    }


def _decoded_counts(schema: str, shards: dict, tmp_path: Path) -> dict:
    """The same counts from what the consumers' decoders read: the Model Garden's TfExampleDecoder
    (odapi) or TFDS's builder_from_directory (tfds)."""
    counts: dict = {}
    if schema == "odapi":
        for split, shard in shards.items():
            for example in model_garden.decode([str(shard)], False, tmp_path / f"{split}.npz"):
                pairs = zip(example["groundtruth_classes"], example["groundtruth_area"], strict=True)
                for cls, area in pairs:
                    counts.setdefault((split, CLASSES[int(cls) - 1]), []).append(float(area))
    else:
        import tensorflow_datasets as tfds

        builder = tfds.builder_from_directory(str(next(iter(shards.values())).parent))
        for split in shards:
            for example in builder.as_dataset(split=split).as_numpy_iterator():
                for cls, area in zip(example["objects"]["label"], example["objects"]["area"], strict=True):
                    counts.setdefault((split, CLASSES[int(cls)]), []).append(float(area))
    result: dict = {}
    for (split, cls), areas in counts.items():
        sizes = collections.Counter(
            "small" if a < 32**2 else "medium" if a < 96**2 else "large" for a in areas
        )
        result.setdefault(split, {})[cls] = dict(sizes)
    return result


def test_inspect_counts_objects_per_split_class_and_coco_size(written, tmp_path, capsys):
    schema, out, shards = written
    stats = inspection.collect_stats(str(out), samples_per_class=0)
    assert _counted(stats) == EXPECTED
    assert _counted(stats) == _decoded_counts(schema, shards, tmp_path)  # as the decoders read them
    assert dict(stats.background) == BACKGROUND
    assert not stats.samples  # no samples asked: counters only

    assert main.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "objects in train: 4 (COCO sizes: 2 small, 1 medium, 1 large); 1 of 3 images without objects\n"
        in text
    )
    assert (
        "objects in test: 1 (COCO sizes: 1 small, 0 medium, 0 large); 1 of 2 images without objects\n" in text
    )
    assert not re.search(r"^ +\d", text, re.M)  # no rows of a blank image-level class
    block = text[text.index("objects in train") :].splitlines()[1:4]
    assert [line.split() for line in block] == [["cat", "1"], ["dog", "2"], ["person", "1"]]
    # The class rows keep one column for the counts.
    starts = {len(re.match(r"^(  \S+\s+)\d", line)[1]) for line in block}
    assert len(starts) == 1, block


class _Svg(HTMLParser):
    """The report's figures with objects: per figure (section heading), its boxes' rects and
    class names and whether it has an overlay layer."""

    def __init__(self):
        super().__init__()
        self.h2: list[str] = []
        self.figures: list[dict] = []
        self._heading = ""
        self._tag = ""
        self._box = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._tag = tag
        if tag == "svg" and "objects" in a.get("class", ""):
            self.figures.append(
                {
                    "section": self._heading,
                    "label": a["aria-label"],
                    "boxes": [],
                    "overlay": False,
                    "size": None,
                }
            )
            self.figures[-1]["size"] = (float(a["width"]), float(a["height"]))
        elif tag == "image" and a.get("class") == "overlay":
            self.figures[-1]["overlay"] = True
        elif tag == "g" and a.get("class") == "box":
            self._box = {"class": a["data-class"]}
            self.figures[-1]["boxes"].append(self._box)
        elif tag == "rect" and self._box is not None:
            self._box["rect"] = tuple(float(a[k]) for k in ("x", "y", "width", "height"))
            self._box["stroke"] = a["stroke"]
        elif tag == "text" and self._box is not None:
            self._box["text_at"] = (float(a["x"]), float(a["y"]))

    def handle_endtag(self, tag):
        if tag == "g":
            self._box = None

    def handle_data(self, data):
        if self._tag == "h2":
            self.h2.append(data)
        elif self._tag == "h3":
            self._heading = data
        elif self._tag == "text" and self._box is not None:
            self._box["text"] = data
        self._tag = ""


def test_report_draws_each_samples_boxes_names_and_overlays(written, tmp_path, capsys):
    schema, out, _ = written
    report = tmp_path / "report.html"
    assert main.main(["inspect", str(out), "--report", str(report)]) == 0
    capsys.readouterr()
    page = report.read_text(encoding="utf-8")
    parsed = _Svg()
    parsed.feed(page)
    assert "Objects" in parsed.h2 and parsed.h2.index("Objects") < parsed.h2.index("Samples")
    # Samples per object class (an image in each class it shows), then those without objects.
    sections = [(f["section"], f["label"].split(":")[0]) for f in parsed.figures]
    assert sections == [
        ("cat", "d.png"),
        ("cat", "a.png"),
        ("dog", "a.png"),
        ("dog", "c.png"),
        ("person", "c.png"),
        ("(no objects)", "e.png"),
        ("(no objects)", "b.png"),
    ]
    a = next(f for f in parsed.figures if f["label"].startswith("a.png"))
    assert a["size"] == (256, 128)
    scale = 256 / W
    cat, dog = a["boxes"]
    assert (cat["class"], cat["text"], dog["class"], dog["text"]) == ("cat", "cat", "dog", "dog")
    assert cat["rect"] == pytest.approx(
        (
            CAT_BOX[0] * scale,
            CAT_BOX[1] * scale,
            (CAT_BOX[2] - CAT_BOX[0]) * scale,
            (CAT_BOX[3] - CAT_BOX[1]) * scale,
        ),
        abs=0.05,
    )
    assert cat["stroke"] != dog["stroke"]  # a colour a class
    assert cat["text_at"][1] < cat["rect"][1]  # the name above the box
    overlays = {f["label"].split(":")[0]: f["overlay"] for f in parsed.figures}
    # Masks and c.png's class map (odapi) on every image with objects; none with tfds.
    masks = schema == "odapi"
    assert overlays == {"a.png": masks, "b.png": False, "c.png": masks, "d.png": masks, "e.png": False}
    # Captions count the objects drawn.
    assert re.search(r"a\.png · train · 200×100 · [\d.]+ \w?B · 2 objects</figcaption>", page)


def test_the_class_map_overlay_colours_its_classes_and_leaves_background_and_ignore_clear():
    class_map = np.zeros((10, 20), np.uint8)
    class_map[2:8, 5:15] = 2
    class_map[0, :] = 255
    png = _png_bytes(class_map)
    layer = drawing.overlay_png(SampleObjects(class_map=png), (20, 10))
    pixels = np.asarray(Image.open(io.BytesIO(layer)))
    assert tuple(pixels[5, 10]) == (*drawing.class_colour(2), round(255 * 0.45))
    assert pixels[0, 10, 3] == 0 and pixels[9, 0, 3] == 0  # ignore (255) and background (0)
    assert drawing.class_colour(1) == (128, 0, 0) and drawing.class_colour(15) == (
        192,
        128,
        128,
    )  # VOC's
    assert drawing.overlay_png(SampleObjects(boxes=((0, 0, 1, 1),), classes=(0,)), (4, 4)) is None


def _png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed")
def test_chromium_shows_the_box_its_name_and_the_mask_over_the_sample(tmp_path, capsys):
    """One teal image with a cat's box and a smaller mask inside it: in the screenshot, the box's
    colour runs along the box's four edges (scaled to the drawn image, within 2 pixels), the mask's
    pixels are teal tinted with the cat's colour, the rest of the box and the image stay teal."""
    records = [
        ImageRecord(
            _image(tmp_path / "a.png"),
            "a.png",
            1,
            (),
            "train",
            (),
            _objects(["cat"], [CAT_BOX], [4000], masks=True),
        )
    ]
    out = tmp_path / "out"
    outcome, _, _ = write_records(out, records, ClassIndex(CLASSES, 1), schema="odapi", masks=True)
    assert outcome.failures == ()
    report, shot = tmp_path / "report.html", tmp_path / "shot.png"
    assert main.main(["inspect", str(out), "--report", str(report)]) == 0
    capsys.readouterr()
    chromium_screenshot(report, shot, 1000, 1600)
    with Image.open(shot) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int32)

    def near(colour, tolerance=24):
        return np.abs(pixels - np.array(colour)).sum(axis=2) <= tolerance

    rows, cols = np.nonzero(near(TEAL))
    left, top = cols.min(), rows.min()  # the drawn image's corner: teal up to its edges
    assert (cols.max() + 1 - left, rows.max() + 1 - top) == (256, 128)
    scale = 256 / W
    x0, y0, x1, y1 = (round(v * scale) for v in CAT_BOX)
    cat = near(drawing.box_colour(0), 40)
    span = slice(top + y0 + 6, top + y1 - 6)
    for column in (left + x0, left + x1):
        assert cat[span, column - 2 : column + 2].any(axis=1).all(), (
            f"no left/right edge at x={column - left}"
        )
    span = slice(left + x0 + 6, left + x1 - 6)
    for row in (top + y0, top + y1):
        assert cat[row - 2 : row + 2, span].any(axis=0).all(), f"no top/bottom edge at y={row - top}"
    # The name above the box: cat-coloured pixels above its top edge, none above elsewhere.
    above = cat[top : top + y0 - 2]
    assert above[:, left + x0 : left + x0 + 30].any() and not above[:, left + x1 + 5 : left + 256].any()
    # The mask: teal tinted 45% with the cat's colour; the box around it and the image: teal.
    tinted = np.array(TEAL) * 0.55 + np.array(drawing.box_colour(0)) * 0.45
    mx, my = (round((CAT_MASK[0] + CAT_MASK[2]) / 2 * scale), round((CAT_MASK[1] + CAT_MASK[3]) / 2 * scale))
    assert np.abs(pixels[top + my, left + mx] - tinted).sum() <= 24, pixels[top + my, left + mx]
    assert near(TEAL)[top + y0 + 4, left + x0 + 4] and near(TEAL)[top + 120, left + 200]


def _edited(shard: Path, out: Path, edit) -> Path:
    """The first record of `shard` with `edit(features)` applied, as a shard of its own."""
    import tensorflow as tf

    from tests.conftest import frame_record

    raw = next(iter(tf.data.TFRecordDataset(str(shard)))).numpy()
    example = tf.train.Example.FromString(raw)
    edit(example.features.feature)
    out.write_bytes(frame_record(example.SerializeToString()))
    return out


def test_the_records_objects_are_checked_before_they_are_counted(tmp_path):
    """A record whose object keys disagree is a named bad record, not a crash (box keys of
    different lengths used to raise numpy's ValueError); a record without areas (optional for
    the OD API's readers) is counted by its boxes' areas."""
    from transforms.encoding.dataset_format import DatasetFormat
    from transforms.verify.shards import check_shard

    out, shards = _dataset(tmp_path, "odapi")
    fmt = DatasetFormat.from_summary(json.loads((out / "summary.json").read_text()))
    train = shards["train"]  # a.png first: cat (80 x 50 px box, area 4000), dog (60 x 50, area 500)

    def one_xmin_less(f):
        f["image/object/bbox/xmin"].float_list.value.pop()

    def extra_label(f):
        f["image/object/class/label"].int64_list.value.append(1)

    def small_map(f):
        f["image/segmentation/class/encoded"].bytes_list.value.append(_png_bytes(np.zeros((2, 2), np.uint8)))

    for name, edit, reason in (
        ("boxes", one_xmin_less, "box keys of different lengths"),
        ("labels", extra_label, "image/object/class/label holds 3 values for 2 boxes"),
        ("map", small_map, "class map is 2x2, the image 200x100"),
    ):
        check = check_shard(str(_edited(train, tmp_path / f"{name}.tfrecord", edit)), fmt, list(CLASSES), 1)
        assert not check.ok and reason in check.error, (name, check.error)

    def no_area(f):
        del f["image/object/area"].float_list.value[:]

    check = check_shard(str(_edited(train, tmp_path / "no-area.tfrecord", no_area)), fmt, list(CLASSES), 1)
    assert check.ok, check.error
    assert check.objects == (("cat", "medium", 1), ("dog", "medium", 1))  # 4000 and 3000 px boxes
    with_area = check_shard(
        str(_edited(train, tmp_path / "as-written.tfrecord", lambda f: None)), fmt, list(CLASSES), 1
    )
    assert with_area.objects == (("cat", "medium", 1), ("dog", "small", 1))  # the written areas
    # verify --beam's results file carries the counts (and a classification shard's has no such keys).
    from transforms.verify.shards import ShardCheck

    assert ShardCheck.from_json(with_area.to_json()) == with_area
    assert "objects" not in ShardCheck("x.tfrecord", records=3).to_json()
