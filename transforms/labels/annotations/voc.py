"""Pascal VOC XML annotation files as annotation rows (pure).

In: VOC XML files (one per image: `filename`, `size` (width, height), `object`s with `name`,
`bndbox` (xmin, ymin, xmax, ymax), `difficult`, `truncated`), each read whole (at most
MAX_FILE_BYTES). Out: rows (rows.py) keyed by the file's `filename`, one per object in file
order, each with the declared size; an image-only row for a file without objects.

Coordinates: VOC's corners are 1-based pixel indices, both inclusive (xmin=1, xmax=W covers
the whole width). In the rows' continuous coordinates (pixel column 0 spans 0..1) that box is
0..W: xmin - 1 and ymin - 1, xmax and ymax as written (detectron2's `load_voc_instances`
does the same; TFDS's voc builder and the OD API's
object_detection/dataset_tools/create_pascal_tf_record.py divide the 1-based values as they
are, which puts each box's top-left corner one pixel right and down).

The XML is parsed by the standard library's expat with the protections of defusedxml's
default: a document that declares an entity (internal or external) or refers to an external
one is refused, so nothing is expanded or fetched (expat 2.4+ would stop a "billion laughs"
only after ~8 MiB of expansion; here none happens). A file that is not well-formed XML, is
not a VOC `annotation`, or holds a bad object is a failure row naming the file (and object).
"""

from __future__ import annotations

import posixpath
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from xml.parsers import expat

import pyarrow as pa

from transforms.labels.annotations.files import rows_of_files
from transforms.labels.annotations.rows import RowBuilder, class_name
from transforms.labels.table import normalize_key
from transforms.records import BATCH_SIZE

# A VOC file is ~1 KB, plus ~250 bytes an object: 16 MB is ~60,000 objects.
MAX_FILE_BYTES = 16 << 20
SUFFIX = ".xml"
_FLAGS = {"0": False, "1": True, "false": False, "true": True}


class _Forbidden(Exception):
    """The XML declares or refers to an entity (defusedxml's EntitiesForbidden)."""


def parse_xml(data: bytes) -> ET.Element:
    """The root element of an XML document, by expat, refusing any entity declaration or
    external reference (raises _Forbidden) and malformed XML (raises ET.ParseError)."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()

    def forbid(*_) -> None:
        raise _Forbidden("declares or refers to an XML entity (not allowed: nothing is expanded)")

    parser.EntityDeclHandler = forbid
    parser.UnparsedEntityDeclHandler = forbid
    parser.ExternalEntityRefHandler = forbid
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.buffer_text = True
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        raise ET.ParseError(f"not well-formed XML: {expat.ErrorString(e.code)} (line {e.lineno})") from None
    return builder.close()


def _text(element: ET.Element | None, tag: str) -> str | None:
    found = element.find(tag) if element is not None else None
    return found.text.strip() if found is not None and found.text is not None else None


def _number(element: ET.Element | None, tag: str) -> float | None:
    text = _text(element, tag)
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value - value == 0 else None  # finite


def file_rows(rows: RowBuilder, data: bytes, source: str) -> None:
    """The rows of one VOC file's bytes (`source` names it) added to `rows`."""
    try:
        root = parse_xml(data)
    except (ET.ParseError, _Forbidden) as e:
        return rows.fail(None, 0, str(e), source=source)
    if root.tag != "annotation":
        return rows.fail(None, 0, f"the root element is <{root.tag}>, not a VOC <annotation>", source=source)
    filename = _text(root, "filename")
    if not filename:
        return rows.fail(None, 0, "no <filename>: the image it annotates is unknown", source=source)
    key = normalize_key(filename)
    size = root.find("size")
    declared = None
    if size is not None:
        width, height = _number(size, "width"), _number(size, "height")
        if not (width and height and width > 0 and height > 0 and width.is_integer() and height.is_integer()):
            return rows.fail(key, 0, "<size> width and height must be positive integers", source=source)
        declared = int(width), int(height)
    objects = root.findall("object")
    if not objects:
        return rows.add(key, declared=declared, line=0, source=source)
    for n, obj in enumerate(objects, 1):
        _object(rows, key, n, obj, declared, source)


def _object(rows: RowBuilder, key: str, n: int, obj: ET.Element, declared, source: str) -> None:
    """The row of the file's object `n` (from 1): an object, or a failure naming it."""
    label, problem = class_name(_text(obj, "name") or "")
    box = obj.find("bndbox")
    corners = [_number(box, tag) for tag in ("xmin", "ymin", "xmax", "ymax")]
    flags = {tag: _FLAGS.get((_text(obj, tag) or "0").lower()) for tag in ("difficult", "truncated")}
    where = f"object {n}"
    if problem:
        return rows.fail(key, n, f"{where}: <name>: {problem}", source=source)
    if box is None or None in corners:
        return rows.fail(
            key, n, f"{where} ({label}): <bndbox> needs numbers xmin, ymin, xmax, ymax", source=source
        )
    bad = [tag for tag, value in flags.items() if value is None]
    if bad:
        return rows.fail(key, n, f"{where} ({label}): <{bad[0]}> is not 0 or 1", source=source)
    xmin, ymin, xmax, ymax = corners
    rows.add(
        key,
        label,
        (xmin - 1, ymin - 1, xmax, ymax),
        difficult=flags["difficult"],
        truncated=flags["truncated"],
        declared=declared,
        line=n,
        source=source,
    )


def voc_rows(paths: Iterable[str], size: int = BATCH_SIZE) -> Iterator[pa.RecordBatch]:
    """The rows of VOC files (each read whole, up to MAX_FILE_BYTES), in batches of up to `size` rows."""
    return rows_of_files(paths, file_rows, MAX_FILE_BYTES, size=size)


def is_voc_file(path: str) -> bool:
    return posixpath.splitext(path)[1].lower() == SUFFIX
