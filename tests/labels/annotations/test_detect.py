"""--labels_format auto for annotations: a .json's top-level keys, a folder's files."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from transforms.labels.annotations.detect import detect_format, top_level_keys
from transforms.labels.annotations.rows import AnnotationError


def _folder(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            Image.new("P", (4, 4)).save(path)
        else:
            path.write_text("0 0.5 0.5 0.1 0.1\n" if name.endswith(".txt") else "<annotation/>")
    return str(root)


def test_formats_are_told_by_content_and_files(tmp_path):
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({"info": {"year": 2017}, "licenses": [], "images": [], "annotations": []}))
    assert detect_format(str(coco)) == "coco"
    assert detect_format(_folder(tmp_path / "voc", ["Annotations/a.xml", "Annotations/b.xml"])) == "voc"
    assert detect_format(_folder(tmp_path / "yolo", ["a.txt", "sub/b.txt"])) == "yolo"
    assert detect_format(_folder(tmp_path / "seg", ["a.png", "notes.md"])) == "segmentation"
    assert detect_format(str(tmp_path / "voc" / "Annotations" / "*.xml")) == "voc"
    for table in ("t.csv", "t.tsv", "t.jsonl", "t.csv.gz"):
        assert detect_format(str(tmp_path / table)) is None  # a labels table: labels/table.py's


def test_a_coco_file_whose_images_come_first_and_are_huge_is_told_by_its_first_key(tmp_path):
    coco = tmp_path / "big.json"
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480} for i in range(40_000)]
    coco.write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    assert coco.stat().st_size > 2 << 20  # past the sniffed head
    assert detect_format(str(coco)) == "coco"


@pytest.mark.parametrize(
    "names, message",
    [
        (["a.xml", "b.txt"], "holds files of voc and yolo (.txt, .xml); pass --labels_format voc|yolo"),
        (
            ["a.md", "b.jpg"],
            "no .xml (voc), .txt (yolo) or .png (segmentation) files in it; pass --labels_format",
        ),
        ([], "no .xml (voc)"),
    ],
)
def test_a_folder_that_does_not_tell_its_format_is_refused(tmp_path, names, message):
    (tmp_path / "labels").mkdir()
    with pytest.raises(AnnotationError) as e:
        detect_format(_folder(tmp_path / "labels", names))
    assert message in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"rows": [1, 2]}', "its top-level keys (rows) hold none of images, annotations, categories"),
        ('[{"id": "a"}]', "its top level is not a JSON object"),
        ('{"id": "a", "label": "cat"}\n{"id": "b", "label": "dog"}\n', "name it .jsonl"),
        ("not json", "its top level is not a JSON object"),
    ],
)
def test_a_json_that_is_not_coco_is_refused(tmp_path, text, message):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(AnnotationError) as e:
        detect_format(str(tmp_path / "t.json"))
    assert message in str(e.value)


def test_a_single_file_of_unknown_kind_asks_for_the_format(tmp_path):
    (tmp_path / "labels.txt").write_text("id,label\nx,cat\n")
    with pytest.raises(AnnotationError, match="cannot tell the format from the name; pass --labels_format"):
        detect_format(str(tmp_path / "labels.txt"))


def test_top_level_keys_of_a_head():
    assert top_level_keys(b'{"info": {"a": [1, 2]}, "images": [{"id": 1}, {"id"') == ["info", "images"]
    assert top_level_keys(b"[1, 2") is None
