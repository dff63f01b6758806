"""Semantic segmentation maps as annotation rows (pure): a folder of PNG class maps.

In: `.png` files, one per image with the image's stem (`JPEGImages/a.jpg` <->
`SegmentationClass/a.png`, as Pascal VOC and DeepLab lay them out), each a palette or
grayscale PNG whose pixel values are class ids (255: ignore). Out: one image-only row a map,
keyed by its stem, with the map's path in `segmentation_path` and its size (from the PNG
header) as the declared size; the writer reads the map beside the image.

Only the PNG header is read here (HEADER_BYTES a file, its checksum checked): a file that is
not a PNG, or is a PNG of colours (RGB, alpha) or 16-bit values rather than 8-bit class ids,
is a failure row naming the file. The pixels are read and checked against the image's size
by the writer.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator

import pyarrow as pa

from transforms.labels.annotations.files import rows_of_files, stem_key
from transforms.labels.annotations.rows import RowBuilder
from transforms.records import BATCH_SIZE

SUFFIX = ".png"
_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Signature, then the IHDR chunk: length, type, 13 bytes of data, CRC.
HEADER_BYTES = 8 + 4 + 4 + 13 + 4
# PNG colour types whose pixels are single values (class ids): grayscale and palette.
_CLASS_MAP_TYPES = {0: "grayscale", 3: "palette"}
_COLOUR_TYPES = {2: "RGB", 4: "grayscale with alpha", 6: "RGBA"}


def map_problem(header: bytes) -> tuple[tuple[int, int] | None, str | None]:
    """((width, height), None) for the first HEADER_BYTES of a usable class map, else (None, why)."""
    if not header.startswith(_SIGNATURE):
        return None, "not a PNG file"
    if len(header) < HEADER_BYTES or header[12:16] != b"IHDR":
        return None, "a PNG without its IHDR header (truncated?)"
    body, (crc,) = header[12:29], struct.unpack(">I", header[29:33])
    if zlib.crc32(body) != crc:
        return None, "a PNG whose IHDR header is damaged (checksum)"
    width, height, depth, colour = struct.unpack(">IIBB", header[16:26])
    if colour in _COLOUR_TYPES:
        return None, (
            f"a PNG of {_COLOUR_TYPES[colour]} pixels is not a class map: each pixel must be a class id "
            "(a palette or grayscale PNG)"
        )
    if colour not in _CLASS_MAP_TYPES or depth not in (1, 2, 4, 8):
        return None, f"a PNG of {depth}-bit values is not read as a class map (8-bit class ids, 255 = ignore)"
    if not width or not height or width >= 2**31 or height >= 2**31:
        return None, f"a PNG of {width} x {height} pixels"
    return (width, height), None


def map_row(rows: RowBuilder, header: bytes, path: str) -> None:
    """The row of the map at `path` from its first HEADER_BYTES, added to `rows`."""
    key = stem_key(path)
    size, problem = map_problem(header)
    if problem:
        return rows.fail(key, 0, problem, source=path)
    rows.add(key, declared=size, segmentation_path=path, line=0, source=path)


def map_rows(paths: Iterable[str], size: int = BATCH_SIZE) -> Iterator[pa.RecordBatch]:
    """The rows of PNG class maps (their headers read), in batches of up to `size` rows."""

    def parse(rows: RowBuilder, header: bytes, path: str) -> None:
        map_row(rows, header[:HEADER_BYTES], path)

    return rows_of_files(paths, parse, HEADER_BYTES, prefix=True, key_of=stem_key, size=size)
