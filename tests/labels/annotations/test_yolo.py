"""The YOLO reader on real label files and class-name files written to tmp_path."""

from __future__ import annotations

import pyarrow as pa
import pytest

from transforms.labels.annotations import yolo
from transforms.labels.annotations.files import list_files
from transforms.labels.annotations.rows import AnnotationError, is_normalized

NAMES = ("person", "bicycle", "car")


def _rows(paths, names=NAMES) -> list[dict]:
    table = pa.Table.from_batches(list(yolo.yolo_rows(paths, names)))
    assert is_normalized(table)
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def test_boxes_from_centre_and_size_in_file_order_and_empty_files_as_background(tmp_path):
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "img_1.txt").write_text("0 0.5 0.5 0.2 0.4\r\n\n2 0.25 0.75 0.5 0.5\n1.0 0.1 0.1 0.2 0.2")
    (labels / "img_2.txt").write_bytes(b"")
    (labels / "img_3.txt").write_bytes("\ufeff1 0.5 0.5 1 1\n".encode())  # a BOM, as Windows tools write
    common = {"is_crowd": False, "difficult": False, "truncated": False}
    source = str(labels / "img_1.txt")
    got = _rows(list_files(str(labels), (".txt",)))
    boxes = [(r["key"], r.get("xmin"), r.get("ymin"), r.get("xmax"), r.get("ymax")) for r in got]
    assert boxes == [
        ("img_1", pytest.approx(0.4), pytest.approx(0.3), pytest.approx(0.6), pytest.approx(0.7)),
        ("img_1", 0.0, 0.5, 0.5, 1.0),
        ("img_1", 0.0, 0.0, 0.2, 0.2),
        ("img_2", None, None, None, None),
        ("img_3", 0.0, 0.0, 1.0, 1.0),
    ]
    assert [{k: v for k, v in r.items() if k not in ("xmin", "ymin", "xmax", "ymax")} for r in got] == [
        {"key": "img_1", "label": "person", "line": 1, "source": source, **common},
        {"key": "img_1", "label": "car", "line": 3, "source": source, **common},
        {"key": "img_1", "label": "bicycle", "line": 4, "source": source, **common},
        {"key": "img_2", "line": 0, "source": str(labels / "img_2.txt")},
        {"key": "img_3", "label": "bicycle", "line": 1, "source": str(labels / "img_3.txt"), **common},
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        (b"0 0.5 0.5 0.2", "line 1: 4 fields, not class cx cy w h (too few fields)"),
        (
            b"0 0.1 0.1 0.9 0.1 0.9 0.9",
            "line 1: 7 fields, not class cx cy w h (a polygon (YOLO segmentation)",
        ),
        (b"0 0.5 0.5 0.2 abc", "line 1: '0 0.5 0.5 0.2 abc' is not five numbers"),
        (b"0 nan 0.5 0.2 0.2", "is not five numbers"),
        (b"3 0.5 0.5 0.2 0.2", "line 1: class 3 is not an index of --label_map (0..2)"),
        (b"-1 0.5 0.5 0.2 0.2", "class -1 is not an index"),
        (b"0.5 0.5 0.5 0.2 0.2", "class 0.5 is not an index"),
        (b"\xff\xfe0 0.5", "not UTF-8 text"),
    ],
)
def test_a_malformed_line_or_file_is_a_named_failure_row_of_its_image(tmp_path, text, message):
    (tmp_path / "bad.txt").write_bytes(text + b"\n" if text.isascii() else text)
    failed = [r for r in _rows([str(tmp_path / "bad.txt")]) if "error" in r]
    assert len(failed) == 1 and message in failed[0]["error"], failed
    assert failed[0]["key"] == "bad" and failed[0]["source"] == str(tmp_path / "bad.txt")


def test_class_names_from_a_names_file_or_a_data_yaml(tmp_path):
    (tmp_path / "classes.txt").write_text("person\nbicycle\ncar\n")
    (tmp_path / "list.yaml").write_text(
        "path: ../datasets/coco8\ntrain: images/train\nnames: [person, bicycle, car]\n"
    )
    (tmp_path / "dict.yaml").write_text("names:\n  0: person\n  1: bicycle\n  2: car\nnc: 3\n")
    for name in ("classes.txt", "list.yaml", "dict.yaml"):
        got = yolo.load_class_names(str(tmp_path / name))
        assert got.names == NAMES and got.first_id == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("names: [a, b]\nnc: 3\n", "nc is 3 but `names` lists 2 classes"),
        ("names:\n  0: a\n  2: b\n", "`names` must map the indices 0..1 to names"),
        ("names: [a, a]\n", "lists 'a' twice"),
        ('names: [a, "b\\tc"]\n', "names[1]: class name 'b\\tc' contains a control character"),
        ("names: [a, [b]]\n", "names[1]: class name ['b'] is not text"),
        ("train: images\n", "no `names` list"),
        ("names: [a\n", "not YAML"),
        ("!!python/object/apply:os.system ['true']\n", "not YAML"),  # safe_load: no Python objects
    ],
)
def test_a_bad_data_yaml_is_refused_in_one_line(tmp_path, text, message):
    (tmp_path / "data.yaml").write_text(text)
    with pytest.raises(AnnotationError) as e:
        yolo.load_class_names(str(tmp_path / "data.yaml"))
    assert message in str(e.value) and "\n" not in str(e.value)
