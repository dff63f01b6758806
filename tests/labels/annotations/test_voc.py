"""The Pascal VOC reader on real XML files written to tmp_path: rows, the 1-based corners,
hostile and malformed XML as named failure rows, the listing of a folder or glob."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import pyarrow as pa
import pytest

from transforms.labels.annotations import voc
from transforms.labels.annotations.files import list_files
from transforms.labels.annotations.rows import is_normalized


def voc_xml(filename: str | None, size=(500, 375), objects=()) -> bytes:
    """A VOC annotation as LabelImg and the VOC devkit write one."""
    root = ET.Element("annotation")
    ET.SubElement(root, "folder").text = "VOC2012"
    if filename is not None:
        ET.SubElement(root, "filename").text = filename
    if size is not None:
        s = ET.SubElement(root, "size")
        for tag, value in zip(("width", "height", "depth"), (*size, 3)):
            ET.SubElement(s, tag).text = str(value)
    for name, box, difficult, truncated in objects:
        o = ET.SubElement(root, "object")
        ET.SubElement(o, "name").text = name
        ET.SubElement(o, "pose").text = "Unspecified"
        if truncated is not None:
            ET.SubElement(o, "truncated").text = str(truncated)
        if difficult is not None:
            ET.SubElement(o, "difficult").text = str(difficult)
        if box is not None:
            b = ET.SubElement(o, "bndbox")
            for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), box):
                ET.SubElement(b, tag).text = str(value)
    return ET.tostring(root)


def _rows(paths) -> list[dict]:
    table = pa.Table.from_batches(list(voc.voc_rows(paths)))
    assert not is_normalized(table)
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def test_objects_in_file_order_with_zero_based_corners_flags_and_declared_size(tmp_path):
    (tmp_path / "2007_000027.xml").write_bytes(
        voc_xml(
            "2007_000027.jpg",
            objects=[("person", (174, 101, 349, 351), 0, 0), ("dog", (1, 1, 500, 375), 1, 1), ("cat", (2.5, 3, 9, 9), None, None)],
        )
    )  # fmt: skip
    (tmp_path / "2007_000032.xml").write_bytes(voc_xml("2007_000032.jpg", size=(320, 240)))
    source = str(tmp_path / "2007_000027.xml")
    common = {"key": "2007_000027.jpg", "declared_width": 500, "declared_height": 375, "source": source}
    assert _rows(list_files(str(tmp_path), (".xml",))) == [
        {**common, "label": "person", "xmin": 173.0, "ymin": 100.0, "xmax": 349.0, "ymax": 351.0,
         "is_crowd": False, "difficult": False, "truncated": False, "line": 1},
        # 1-based inclusive corners 1..500 cover the whole width: 0..500 in continuous coordinates
        {**common, "label": "dog", "xmin": 0.0, "ymin": 0.0, "xmax": 500.0, "ymax": 375.0,
         "is_crowd": False, "difficult": True, "truncated": True, "line": 2},
        {**common, "label": "cat", "xmin": 1.5, "ymin": 2.0, "xmax": 9.0, "ymax": 9.0,
         "is_crowd": False, "difficult": False, "truncated": False, "line": 3},
        # a file without objects: the image exists, with no object (a background image)
        {"key": "2007_000032.jpg", "declared_width": 320, "declared_height": 240, "line": 0,
         "source": str(tmp_path / "2007_000032.xml")},
    ]  # fmt: skip


_BILLION_LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE annotation [<!ENTITY a "aaaaaaaaaa">'
    + b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8))
    + b"]><annotation><filename>x.jpg</filename><object><name>&i;</name></object></annotation>"
)


@pytest.mark.parametrize(
    "data, message, key",
    [
        (b"<annotation><filename>a.jpg</filename>", "not well-formed XML: no element found (line 1)", None),
        (b"\x00\x01binary", "not well-formed XML", None),
        (_BILLION_LAUGHS, "declares or refers to an XML entity", None),
        (
            b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b"<annotation><filename>&x;</filename></annotation>",
            "declares or refers to an XML entity",
            None,
        ),
        (  # an external DTD is never fetched (no network, no file): the document is read without it
            b'<?xml version="1.0"?><!DOCTYPE a SYSTEM "http://example.invalid/voc.dtd"><annotation/>',
            "no <filename>",
            None,
        ),
        (b"<annotations><filename>a.jpg</filename></annotations>", "the root element is <annotations>", None),
        (voc_xml(None), "no <filename>", None),
        (voc_xml("a.jpg", size=(0, 10)), "<size> width and height must be positive integers", "a.jpg"),
        (
            voc_xml("a.jpg", objects=[("", (1, 1, 2, 2), 0, 0)]),
            "object 1: <name>: the class name is empty",
            "a.jpg",
        ),
        (voc_xml("a.jpg", objects=[("a\tb", (1, 1, 2, 2), 0, 0)]), "contains a control character", "a.jpg"),
        (voc_xml("a.jpg", objects=[("cat", None, 0, 0)]), "object 1 (cat): <bndbox> needs numbers", "a.jpg"),
        (voc_xml("a.jpg", objects=[("cat", (1, "x", 2, 2), 0, 0)]), "<bndbox> needs numbers", "a.jpg"),
        (voc_xml("a.jpg", objects=[("cat", (1, "nan", 2, 2), 0, 0)]), "<bndbox> needs numbers", "a.jpg"),
        (voc_xml("a.jpg", objects=[("cat", (1, 1, 2, 2), "maybe", 0)]), "<difficult> is not 0 or 1", "a.jpg"),
    ],
)
def test_hostile_and_malformed_files_are_named_failure_rows(tmp_path, data, message, key):
    (tmp_path / "bad.xml").write_bytes(data)
    (tmp_path / "good.xml").write_bytes(voc_xml("g.jpg", objects=[("cat", (1, 1, 2, 2), 0, 0)]))
    started = time.monotonic()
    rows = _rows(sorted(map(str, tmp_path.glob("*.xml"))))
    assert time.monotonic() - started < 5  # nothing expanded
    failed = [r for r in rows if "error" in r]
    assert len(failed) == 1 and message in failed[0]["error"], failed
    assert failed[0]["source"] == str(tmp_path / "bad.xml") and failed[0].get("key") == key
    assert [r["key"] for r in rows if "error" not in r] == ["g.jpg"]


def test_an_unreadable_or_oversized_file_is_a_named_failure_row(tmp_path, monkeypatch):
    monkeypatch.setattr(voc, "MAX_FILE_BYTES", 100)
    (tmp_path / "big.xml").write_bytes(voc_xml("big.jpg", objects=[("cat", (1, 1, 2, 2), 0, 0)] * 3))
    (tmp_path / "gone.xml").symlink_to(tmp_path / "nowhere.xml")
    rows = _rows([str(tmp_path / "big.xml"), str(tmp_path / "gone.xml")])
    assert [(r["source"].rsplit("/", 1)[1], r["error"]) for r in rows] == [
        ("big.xml", "larger than 100 bytes"),
        ("gone.xml", "cannot read: No such file or directory"),
    ]


def test_a_folder_is_listed_as_the_image_listing_walks_one(tmp_path):
    for name in ("b/2.xml", "a.xml", "b/c/3.XML", ".hidden/4.xml", "b/.5.xml", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(voc_xml("x.jpg"))
    found = [p[len(str(tmp_path)) + 1 :] for p in list_files(str(tmp_path), (".xml",))]
    assert found == ["a.xml", "b/2.xml", "b/c/3.XML"]
    globbed = [p[len(str(tmp_path)) + 1 :] for p in list_files(str(tmp_path / "b" / "*.xml"), (".xml",))]
    assert globbed == ["b/2.xml"]
    assert list(list_files(str(tmp_path / "nothing-*.xml"), (".xml",))) == []
