"""The COCO reader on real JSON files written to tmp_path: rows, failures, streaming, masks
against pycocotools."""

from __future__ import annotations

import io
import json
import tracemalloc

import ijson
import numpy as np
import pyarrow as pa
import pytest
from pycocotools import mask as coco_mask

from transforms.labels.annotations import coco
from transforms.labels.annotations.rows import NAMES, AnnotationError, is_normalized, schema

CATEGORIES = [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}, {"id": 90, "name": "toothbrush"}]
POLYGON = [[10.5, 10.25, 40.0, 12.0, 38.75, 30.5, 12.0, 28.0], [50, 50, 60, 50, 55, 58]]


def _write(tmp_path, doc: dict, name: str = "instances.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc).replace("Infinity", "1e999"))  # (JSON has no Infinity)
    return str(path)


def _read(path: str, masks: bool = True, size: int = 1000) -> pa.Table:
    """Every row of a COCO file, joined as the labels join will (one bucket: the whole file)."""
    with open(path, "rb") as f:
        categories = coco.read_categories(f, path)
    with open(path, "rb") as f:
        images = pa.Table.from_batches(list(coco.image_rows(f, path, size)), schema())
    with open(path, "rb") as f:
        annotations = pa.Table.from_batches(
            list(coco.annotation_rows(f, categories, path, masks, size)), schema()
        )
    return coco.attach_images(images, annotations)


def _rows(table: pa.Table) -> list[dict]:
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def _doc(images=None, annotations=None, categories=CATEGORIES) -> dict:
    return {
        "info": {"description": "test"},
        "licenses": [],
        "images": images
        if images is not None
        else [
            {"id": 7, "file_name": "b/000007.jpg", "width": 64, "height": 48},
            {"id": 3, "file_name": "000003.jpg", "width": 80, "height": 60},
            {"id": 5, "file_name": "empty.jpg", "width": 32, "height": 32},
        ],
        "annotations": annotations
        if annotations is not None
        else [
            {"id": 1, "image_id": 3, "category_id": 18, "bbox": [10.5, 10.25, 30, 20.25], "area": 400.5,
             "iscrowd": 0, "segmentation": POLYGON},
            {"id": 2, "image_id": 7, "category_id": 1, "bbox": [0, 0, 64, 48], "iscrowd": 0, "segmentation": []},
            {"id": 3, "image_id": 3, "category_id": 90, "bbox": [1, 2, 3, 4], "area": 12, "iscrowd": 1,
             "segmentation": {"counts": [2, 3, 5, 2], "size": [3, 4]}},
        ],
        "categories": categories,
    }  # fmt: skip


def test_rows_keyed_by_file_name_with_boxes_flags_masks_and_background_images(tmp_path):
    rows = _read(_write(tmp_path, _doc()))
    assert rows.schema.names == list(NAMES) and not is_normalized(rows)
    got = _rows(rows)
    where = {"source": str(tmp_path / "instances.json")}
    assert got[:3] == [
        {
            "key": "b/000007.jpg",
            "declared_width": 64,
            "declared_height": 48,
            "image_id": 7,
            "line": 1,
            **where,
        },
        {"key": "000003.jpg", "declared_width": 80, "declared_height": 60, "image_id": 3, "line": 2, **where},
        {"key": "empty.jpg", "declared_width": 32, "declared_height": 32, "image_id": 5, "line": 3, **where},
    ]
    assert got[3:] == [
        {
            **{"key": "000003.jpg", "label": "dog", "xmin": 10.5, "ymin": 10.25, "xmax": 40.5, "ymax": 30.5},
            **{"is_crowd": False, "difficult": False, "truncated": False, "area": 400.5},
            **{"mask": json.dumps(POLYGON, separators=(",", ":")).encode(), "declared_width": 80},
            **{"declared_height": 60, "image_id": 3, "line": 1, **where},
        },
        {
            **{
                "key": "b/000007.jpg",
                "label": "person",
                "xmin": 0.0,
                "ymin": 0.0,
                "xmax": 64.0,
                "ymax": 48.0,
            },
            **{"is_crowd": False, "difficult": False, "truncated": False, "declared_width": 64},
            **{"declared_height": 48, "image_id": 7, "line": 2, **where},
        },
        {
            **{
                "key": "000003.jpg",
                "label": "toothbrush",
                "xmin": 1.0,
                "ymin": 2.0,
                "xmax": 4.0,
                "ymax": 6.0,
            },
            **{"is_crowd": True, "difficult": False, "truncated": False, "area": 12.0},
            **{"mask": b'{"size":[3,4],"counts":[2,3,5,2]}', "declared_width": 80, "declared_height": 60},
            **{"image_id": 3, "line": 3, **where},
        },
    ]


def test_categories_keep_coco_ids_and_names():
    got = coco.read_categories(io.BytesIO(json.dumps(_doc()).encode()), "x.json")
    assert got.ids == (1, 18, 90) and got.names == ("person", "dog", "toothbrush")


def test_rows_come_in_batches_of_the_given_size_in_file_order(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg"} for i in range(1, 8)]
    annotations = [
        {"id": i, "image_id": 1 + i % 7, "category_id": 1, "bbox": [i, 0, 1, 1]} for i in range(25)
    ]
    path = _write(tmp_path, _doc(images, annotations))
    with open(path, "rb") as f:
        sizes = [b.num_rows for b in coco.annotation_rows(f, coco.Categories((1,), ("a",)), path, size=10)]
    assert sizes == [10, 10, 5]
    rows = _rows(_read(path, size=3))
    objects = [r for r in rows if "label" in r]
    assert [r["line"] for r in objects] == list(range(1, 26))
    assert [r["key"] for r in objects if r["key"] == "3.jpg"] == ["3.jpg"] * 4  # ids 2, 9, 16, 23
    assert [r["xmin"] for r in objects if r["key"] == "3.jpg"] == [2.0, 9.0, 16.0, 23.0]


@pytest.mark.parametrize(
    "annotation, message",
    [
        ("not an object", "annotations[1] is not an object"),
        ({"id": 9, "category_id": 1, "bbox": [0, 0, 1, 1]}, "annotations[1] (id 9): image_id None is not an integer"),
        ({"id": 9, "image_id": 3, "category_id": 2, "bbox": [0, 0, 1, 1]}, "category_id 2 is not in categories"),
        ({"image_id": 3, "category_id": 1, "bbox": [0, 0, 1]}, "bbox [0, 0, 1] is not four finite numbers"),
        ({"image_id": 3, "category_id": 1, "bbox": [0, "0", 1, 1]}, "is not four finite numbers"),
        ({"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "iscrowd": 2}, "iscrowd 2 is not 0 or 1"),
        ({"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "area": "big"}, "area 'big' is not a finite"),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": [[1, 2, 3, 4]]},
            "a polygon must be a list of at least 3 x, y pairs",
        ),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": [[1, 2, 3, "4", 5, 6]]},
            "a polygon holds something other than numbers",
        ),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": {"counts": [1, 2], "size": [2, 2]}},
            "RLE counts sum to 3, not height x width 2 x 2",
        ),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": {"counts": [1, 2.5], "size": [1, 3.5]}},
            "RLE size [1, 3.5] is not [height, width]",
        ),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": {"counts": [4, -1, 1], "size": [2, 2]}},
            "RLE counts must be non-negative integers",
        ),
        (
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": "polygon"},
            "segmentation 'polygon' is neither polygons nor RLE",
        ),
        ({"image_id": 4, "category_id": 1, "bbox": [0, 0, 1, 1]}, "annotations[1]: image_id 4 is not in images"),
    ],
)  # fmt: skip
def test_a_malformed_annotation_is_a_named_failure_row(tmp_path, annotation, message):
    images = [{"id": 3, "file_name": "a.jpg"}]
    good = {"id": 10, "image_id": 3, "category_id": 1, "bbox": [0, 0, 2, 2]}
    rows = _rows(_read(_write(tmp_path, _doc(images, [annotation, good], [{"id": 1, "name": "x"}]))))
    failed = [r for r in rows if "error" in r]
    assert len(failed) == 1 and message in failed[0]["error"], failed
    assert failed[0]["line"] == 1 and failed[0]["source"].endswith("instances.json")
    # a failure whose image is known carries its key (the image fails); others have none
    known = isinstance(annotation, dict) and annotation.get("image_id") == 3
    assert failed[0].get("key") == ("a.jpg" if known else None)
    assert [r["xmax"] for r in rows if "error" not in r and "label" in r] == [2.0]


@pytest.mark.parametrize(
    "image, message",
    [
        ([1, 2], "images[1] is not an object"),
        ({"file_name": "a.jpg"}, "images[1] has no integer id"),
        ({"id": 4}, "images[1] (id 4) has no file_name"),
        (
            {"id": 4, "file_name": "a.jpg", "width": -3, "height": 5},
            "width and height must be positive integers",
        ),
        ({"id": 4, "file_name": "a.jpg", "width": 3}, "width and height must be positive integers"),
    ],
)
def test_a_malformed_image_entry_is_a_named_failure_row(tmp_path, image, message):
    rows = _rows(_read(_write(tmp_path, _doc([image, {"id": 9, "file_name": "ok.jpg"}], []))))
    failed = [r for r in rows if "error" in r]
    assert len(failed) == 1 and message in failed[0]["error"]
    assert [r["key"] for r in rows if "error" not in r] == ["ok.jpg"]


def test_an_image_id_listed_twice_fails_both_images_and_their_annotations(tmp_path):
    images = [
        {"id": 1, "file_name": "a.jpg"},
        {"id": 1, "file_name": "b.jpg"},
        {"id": 2, "file_name": "c.jpg"},
    ]
    annotations = [
        {"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 1]},
    ]
    rows = _rows(_read(_write(tmp_path, _doc(images, annotations))))
    assert [(r.get("key"), r.get("error")) for r in rows] == [
        ("a.jpg", "images[1]: image id 1 is listed twice"),
        ("b.jpg", "images[2]: image id 1 is listed twice"),
        ("c.jpg", None),
        (None, "annotations[1]: image_id 1 is listed twice in images"),
        ("c.jpg", None),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text, message",
    [
        (b'{"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [', "is not valid JSON"),
        (b'{"images": [}', "is not valid JSON"),
        (b"not json at all", "is not valid JSON"),
        (b'{"images": [{"id": 1e999}]}', "numeric (floating point) overflow"),  # json.load: inf
        (b'{"images": [], "annotations": []}', "lists no categories"),
        (b'{"categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}', "id 1 is listed twice"),
        (b'{"categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "a"}]}', "name 'a' is listed twice"),
        (b'{"categories": [{"id": 1, "name": "a\\nb"}]}', "contains a control character"),
        (b'{"categories": [{"id": "1", "name": "a"}]}', "categories[1] has no integer id"),
    ],
)
def test_a_file_that_is_not_coco_json_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    with pytest.raises(AnnotationError) as e, open(path, "rb") as f:
        coco.read_categories(f, str(path))
    assert message in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_truncated_annotations_stop_the_annotation_pass_in_one_line(tmp_path):
    path = tmp_path / "cut.json"
    whole = json.dumps(_doc())
    path.write_text(whole[: whole.index('"categories"') - 40])
    with pytest.raises(AnnotationError, match="is not valid JSON"), open(path, "rb") as f:
        list(coco.annotation_rows(f, coco.Categories((1, 18, 90), ("a", "b", "c")), str(path)))


def test_masks_off_carries_no_segmentation(tmp_path):
    rows = _read(_write(tmp_path, _doc()), masks=False)
    assert rows["mask"].null_count == rows.num_rows
    assert rows.filter(rows["label"].is_valid()).num_rows == 3


def test_the_annotations_are_streamed_not_loaded(tmp_path):
    """A 13 MB file (4,000 annotations of 200-point polygons; ~66 MB as json.load's objects) is
    read holding a read buffer, one item and a batch of rows: the Python heap's peak stays
    under 10 MB, and under a sixth of what loading it whole takes."""
    images = [{"id": i, "file_name": f"{i:06d}.jpg"} for i in range(100)]
    polygon = [[float(v) + 0.25 for v in range(400)]]
    annotations = [
        {"id": i, "image_id": i % 100, "category_id": 18, "bbox": [1, 2, 3, 4], "segmentation": polygon}
        for i in range(4000)
    ]
    path = _write(tmp_path, _doc(images, annotations))
    categories = coco.Categories((18,), ("dog",))
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            count = sum(b.num_rows for b in coco.annotation_rows(f, categories, path, masks=False, size=100))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        with open(path) as f:
            json.load(f)
        loaded = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 4000
    assert peak < 10e6 and peak * 6 < loaded, (peak, loaded)


def test_ijson_runs_on_its_c_backend():
    # The pure-Python backend is ~20x slower; the wheels ship yajl2_c (setup.py pins ijson).
    assert ijson.backend == "yajl2_c"


def _rasterized(segmentation, height: int, width: int) -> np.ndarray:
    """A COCO segmentation as pycocotools rasterises it (what Model Garden's converter writes)."""
    if isinstance(segmentation, list):
        rle = coco_mask.merge(coco_mask.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation["counts"], list):
        rle = coco_mask.frPyObjects(segmentation, height, width)
    else:
        rle = segmentation
    return coco_mask.decode(rle)


def test_mask_text_rasterises_as_the_annotation_does_with_pycocotools(tmp_path):
    """Polygons (with decimals), an uncompressed RLE and a compressed RLE carried as JSON text
    decode, with pycocotools, to exactly the masks of the annotations as json.load reads them."""
    rng = np.random.default_rng(3)
    height, width = 37, 53
    blob = (rng.random((height, width)) > 0.6).astype(np.uint8)
    compressed = coco_mask.encode(np.asfortranarray(blob))
    compressed = {"size": compressed["size"], "counts": compressed["counts"].decode("ascii")}
    counts, value, run = [], 0, 0  # COCO's runs: column-major, alternating, zeros first
    for v in blob.flatten(order="F"):
        if v != value:
            counts.append(run)
            value, run = v, 0
        run += 1
    uncompressed = {"size": [height, width], "counts": [*counts, run]}
    polygons = [[round(float(v), 3) for v in rng.uniform(0, 36, 14)], [1.1, 1.2, 30.7, 2.9, 15.55, 35.05]]
    segmentations = [polygons, uncompressed, compressed]
    images = [{"id": 1, "file_name": "a.jpg", "width": width, "height": height}]
    annotations = [
        {
            "id": i,
            "image_id": 1,
            "category_id": 1,
            "bbox": [0, 0, 5, 5],
            "iscrowd": int(i > 0),
            "segmentation": s,
        }
        for i, s in enumerate(segmentations)
    ]
    path = _write(tmp_path, _doc(images, annotations))
    rows = _read(path)
    masks = [m for m in rows["mask"].to_pylist() if m is not None]
    with open(path) as f:
        loaded = [a["segmentation"] for a in json.load(f)["annotations"]]
    assert len(masks) == 3
    for text, original in zip(masks, loaded):
        ours = _rasterized(json.loads(text), height, width)
        assert ours.any() and np.array_equal(ours, _rasterized(original, height, width))
    assert np.array_equal(_rasterized(json.loads(masks[2]), height, width), blob)
