"""The segmentation-map reader on real PNG class maps written with Pillow in tmp_path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from transforms.labels.annotations import segmentation
from transforms.labels.annotations.files import list_files


def _rows(paths) -> list[dict]:
    table = pa.Table.from_batches(list(segmentation.map_rows(paths)))
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def _class_map(path, mode: str, size=(40, 30)) -> None:
    values = np.zeros(size[::-1], np.uint8)
    values[5:20, 10:30] = 15
    values[0, :] = 255  # ignore
    image = Image.frombytes(mode, size, values.tobytes())
    if mode == "P":  # as VOC's SegmentationClass maps: the values are palette indices
        image.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
    image.save(path)


def test_palette_and_grayscale_maps_become_rows_with_their_path_and_size(tmp_path):
    _class_map(tmp_path / "2007_000032.png", "P")
    _class_map(tmp_path / "2007_000039.png", "L", size=(17, 9))
    (tmp_path / "readme.md").write_text("not a map")
    got = _rows(list_files(str(tmp_path), (".png",)))
    assert got == [
        {"key": "2007_000032", "declared_width": 40, "declared_height": 30, "line": 0,
         "segmentation_path": str(tmp_path / "2007_000032.png"), "source": str(tmp_path / "2007_000032.png")},
        {"key": "2007_000039", "declared_width": 17, "declared_height": 9, "line": 0,
         "segmentation_path": str(tmp_path / "2007_000039.png"), "source": str(tmp_path / "2007_000039.png")},
    ]  # fmt: skip
    assert Image.open(tmp_path / "2007_000032.png").mode == "P"


def _rgb(path):
    Image.new("RGB", (8, 8), (1, 2, 3)).save(path)


def _rgba(path):
    Image.new("RGBA", (8, 8)).save(path)


def _sixteen_bit(path):
    Image.fromarray(np.full((8, 8), 300, np.uint16)).save(path)


def _jpeg_named_png(path):
    Image.new("L", (8, 8)).save(path, "JPEG")


def _truncated(path):
    Image.new("L", (8, 8)).save(path)
    path.write_bytes(path.read_bytes()[:20])


def _damaged_header(path):
    Image.new("L", (8, 8)).save(path)
    data = bytearray(path.read_bytes())
    data[17] ^= 0xFF  # a byte of the width: the IHDR checksum no longer matches
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "write, message",
    [
        (_rgb, "a PNG of RGB pixels is not a class map: each pixel must be a class id"),
        (_rgba, "a PNG of RGBA pixels is not a class map"),
        (_sixteen_bit, "a PNG of 16-bit values is not read as a class map"),
        (_jpeg_named_png, "not a PNG file"),
        (_truncated, "a PNG without its IHDR header (truncated?)"),
        (_damaged_header, "IHDR header is damaged (checksum)"),
    ],
)
def test_a_map_that_is_no_class_map_is_a_named_failure_row_of_its_image(tmp_path, write, message):
    write(tmp_path / "bad.png")
    (got,) = _rows([str(tmp_path / "bad.png")])
    assert message in got["error"] and got["key"] == "bad" and got["source"] == str(tmp_path / "bad.png")
    assert "segmentation_path" not in got
