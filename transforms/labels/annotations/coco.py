"""A COCO instances JSON file as annotation rows (pure), read as a stream, never loaded whole.

In: a COCO file (`images`, `annotations`, `categories`), open as a binary stream (local or
gs://). Out: the categories (the class list), and two streams of rows (rows.py), each from its
own pass over the file, so that the two can be read by two workers and fanned out through the
labels join:

- `image_rows`: one image-only row per `images` entry, keyed by its `file_name`, with its
  `image_id` and declared size;
- `annotation_rows`: one object row per `annotations` entry, with its `image_id` and no key
  (COCO names an annotation's image by id only); `bbox` [x, y, w, h] in pixels becomes the
  corners (x, y, x + w, y + h); `segmentation` (polygons or RLE) is carried as compact JSON
  text in `mask`, for the writer to rasterise (`--masks`).

`attach_images` joins the two on `image_id` for one bucket of image ids: the join keys both by
image id, so no worker holds an image id -> file name table of the whole file.

Each pass is ijson's C backend (yajl2_c) filtering one array's items in C: about 5 s of CPU per
400 MB pass for the arrays not kept (benchmarks/README.md, "COCO reader"). A pass holds one item
and one batch of rows (`size`) at a time; one item is bounded by the file's largest item, and a
mask whose JSON text is over MAX_MASK_BYTES is a failure row, not carried.

Malformed records (an item that is not an object, a missing or mistyped field, an unknown
category, a box of other than four finite numbers, an iscrowd other than 0 or 1) are failure
rows naming their place (`images[i]`, `annotations[i]`, from 1). A file that is not JSON, or
not COCO's shape, stops the reader with AnnotationError (one line).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import BinaryIO

import ijson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.labels.annotations.rows import NAMES, AnnotationError, RowBuilder, class_name, finite
from transforms.labels.table import normalize_key
from transforms.records import BATCH_SIZE

# The categories a file may list: far above any dataset's (COCO 80, LVIS 1,203, Objects365 365).
MAX_CATEGORIES = 100_000
# A mask's JSON text larger than this fails its annotation (COCO's largest crowd RLE is ~30 KB).
MAX_MASK_BYTES = 8 << 20
# Bytes ijson reads at a time.
_READ_BYTES = 1 << 20
# The top-level keys of a COCO file (the sniffer of --labels_format auto looks for one).
TOP_KEYS = ("info", "licenses", "images", "annotations", "categories")
# Characters of a polygon list or of RLE counts as JSON text: numbers, commas, brackets.
_NUMERIC_JSON = b"0123456789.-+eE,[]"
_dump = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


@dataclasses.dataclass(frozen=True)
class Categories:
    """COCO's categories: `names[i]` has id `ids[i]`, ids ascending (COCO's ids have gaps:
    1..90 for 80 classes). The class id written is the category id, as Model Garden's
    official/vision/data/create_coco_tf_record.py keeps it (`image/object/class/label`)."""

    ids: tuple[int, ...]
    names: tuple[str, ...]

    def name_of(self) -> dict[int, str]:
        return dict(zip(self.ids, self.names))


def _items(f: BinaryIO, prefix: str, source: str) -> Iterator:
    """The items at `prefix`, as a stream; AnnotationError (one line) if the file is not JSON."""
    try:
        yield from ijson.items(f, prefix, use_float=True, buf_size=_READ_BYTES)
    except ijson.JSONError as e:
        what = " ".join(str(e).split())[:200]
        raise AnnotationError(f"COCO file {source} is not valid JSON: {what}") from None


def _integer(value: object) -> int | None:
    """An int (not a bool); an integral float counts (some writers emit 42.0)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def read_categories(f: BinaryIO, source: str = "") -> Categories:
    """The categories of a COCO file, in one pass that keeps nothing else.

    Raises AnnotationError: not JSON, no categories, more than MAX_CATEGORIES, a category
    that is not an object with an integer `id` and a usable `name`, an id or a name twice.
    """
    found: dict[int, str] = {}
    names: dict[str, int] = {}
    for i, item in enumerate(_items(f, "categories.item", source), 1):
        where = f"COCO file {source}: categories[{i}]"
        if i > MAX_CATEGORIES:
            raise AnnotationError(f"COCO file {source} lists over {MAX_CATEGORIES:,} categories")
        if not isinstance(item, dict):
            raise AnnotationError(f"{where} is not an object")
        category_id = _integer(item.get("id"))
        if category_id is None:
            raise AnnotationError(f"{where} has no integer id")
        name, problem = class_name(item.get("name"))
        if problem:
            raise AnnotationError(f"{where}: {problem}")
        if category_id in found:
            raise AnnotationError(f"{where}: id {category_id} is listed twice")
        if name in names:
            raise AnnotationError(
                f"{where}: name {name!r} is listed twice (ids {names[name]} and {category_id})"
            )
        found[category_id] = name
        names[name] = category_id
    if not found:
        raise AnnotationError(f"COCO file {source} lists no categories (not a COCO instances file?)")
    ids = tuple(sorted(found))
    return Categories(ids, tuple(found[i] for i in ids))


def image_rows(f: BinaryIO, source: str = "", size: int = BATCH_SIZE) -> Iterator[pa.RecordBatch]:
    """One image-only row per `images` entry (key = file_name, image_id, declared size), in
    file order, in batches of up to `size` rows; failure rows for malformed entries."""
    rows = RowBuilder(source, size=size)
    for i, item in enumerate(_items(f, "images.item", source), 1):
        where = f"images[{i}]"
        if not isinstance(item, dict):
            rows.fail(None, i, f"{where} is not an object")
        else:
            image_id = _integer(item.get("id"))
            name = item.get("file_name")
            key = normalize_key(name) if isinstance(name, str) else ""
            declared, problem = _declared_size(item)
            if image_id is None:
                rows.fail(key or None, i, f"{where} has no integer id")
            elif not key:
                rows.fail(None, i, f"{where} (id {image_id}) has no file_name", image_id=image_id)
            elif problem:
                rows.fail(key, i, f"{where} (id {image_id}): {problem}", image_id=image_id)
            else:
                rows.add(key, declared=declared, image_id=image_id, line=i)
        yield from rows.batches()
    yield from rows.flush()


def _declared_size(item: dict) -> tuple[tuple[int, int] | None, str | None]:
    """(width, height) of an `images` entry if it gives both (None if neither), or the problem."""
    width, height = item.get("width"), item.get("height")
    if width is None and height is None:
        return None, None
    w, h = _integer(width), _integer(height)
    if w is None or h is None or w <= 0 or h <= 0 or w >= 2**31 or h >= 2**31:
        return None, f"width and height must be positive integers, not {width!r} x {height!r}"
    return (w, h), None


def annotation_rows(
    f: BinaryIO, categories: Categories, source: str = "", masks: bool = True, size: int = BATCH_SIZE
) -> Iterator[pa.RecordBatch]:
    """One object row per `annotations` entry (no key yet: attach_images gives it), in file
    order, in batches of up to `size` rows; failure rows for malformed entries.

    Args:
      categories: read_categories of the same file; an unknown category_id fails its annotation.
      masks: carry each `segmentation` as JSON text in `mask` (checked: polygons of at least
        three points, or an RLE whose runs cover its size). False: `mask` stays null and the
        segmentation is not looked at (dumping it costs about as much as parsing the file).
    """
    rows = RowBuilder(source, size=size)
    name_of = categories.name_of()
    for i, item in enumerate(_items(f, "annotations.item", source), 1):
        if not isinstance(item, dict):
            rows.fail(None, i, f"annotations[{i}] is not an object")
        else:
            _annotation(rows, i, item, name_of, masks)
        yield from rows.batches()
    yield from rows.flush()


def _annotation(rows: RowBuilder, i: int, item: dict, name_of: dict[int, str], masks: bool) -> None:
    """The row of annotation `i` (from 1): an object, or a failure naming the problem."""
    image_id = _integer(item.get("image_id"))
    where = f"annotations[{i}]" + (f" (id {item['id']})" if isinstance(item.get("id"), int) else "")

    def fail(problem: str) -> None:
        rows.fail(None, i, f"{where}: {problem}", image_id=image_id)

    if image_id is None:
        return fail(f"image_id {item.get('image_id')!r} is not an integer")
    category = _integer(item.get("category_id"))
    label = name_of.get(category) if category is not None else None
    if label is None:
        return fail(f"category_id {item.get('category_id')!r} is not in categories")
    bbox = item.get("bbox")
    box = finite(bbox) if isinstance(bbox, list) and len(bbox) == 4 else None
    if box is None:
        return fail(f"bbox {_short(bbox)} is not four finite numbers [x, y, width, height]")
    crowd = item.get("iscrowd", 0)
    if crowd not in (0, 1) or isinstance(crowd, float):
        return fail(f"iscrowd {crowd!r} is not 0 or 1")
    area = item.get("area")
    if area is not None:
        area = finite([area])
        if area is None:
            return fail(f"area {_short(item.get('area'))} is not a finite number")
        area = area[0]
    mask = None
    if masks:
        mask, problem = _mask(item.get("segmentation"))
        if problem:
            return fail(problem)
    x, y, w, h = box
    rows.add(
        None,
        label,
        (x, y, x + w, y + h),
        is_crowd=bool(crowd),
        area=area,
        mask=mask,
        image_id=image_id,
        line=i,
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mask(segmentation: object) -> tuple[bytes | None, str | None]:
    """(COCO segmentation as compact JSON text, None), (None, None) for none, or (None, why).

    Polygons: a list of lists of at least six numbers, of even length. RLE: an object with
    `size` [height, width] and `counts`, a list of non-negative integers summing to
    height x width (uncompressed) or COCO's compressed string."""
    if segmentation is None or segmentation == []:
        return None, None
    if isinstance(segmentation, list):
        for polygon in segmentation:
            if not isinstance(polygon, list) or len(polygon) < 6 or len(polygon) % 2:
                return None, "segmentation: a polygon must be a list of at least 3 x, y pairs"
        return _numeric_json(segmentation, "segmentation: a polygon holds something other than numbers")
    if not isinstance(segmentation, dict):
        return None, f"segmentation {_short(segmentation)} is neither polygons nor RLE"
    shape, counts = segmentation.get("size"), segmentation.get("counts")
    if not (
        isinstance(shape, list) and len(shape) == 2 and all(_integer(v) is not None and v >= 0 for v in shape)
    ):
        return None, f"segmentation: RLE size {_short(shape)} is not [height, width]"
    if isinstance(counts, str):
        if not counts.isascii() or not counts.isprintable():
            return None, "segmentation: compressed RLE counts are not printable ASCII"
    elif isinstance(counts, list):
        text, problem = _numeric_json(counts, "segmentation: RLE counts must be integers")
        if problem or b"." in text or b"e" in text or b"E" in text or b"-" in text:
            return None, "segmentation: RLE counts must be non-negative integers"
        if sum(counts) != shape[0] * shape[1]:
            return (
                None,
                f"segmentation: RLE counts sum to {sum(counts):,}, not height x width {shape[0]} x {shape[1]}",
            )
    else:
        return None, "segmentation: RLE counts are neither a list nor a string"
    text = _dump({"size": [int(shape[0]), int(shape[1])], "counts": counts}).encode()
    return _bounded(text)


def _numeric_json(value: list, problem: str) -> tuple[bytes | None, str | None]:
    """`value` as compact JSON if it holds only finite numbers in lists, else (None, problem)."""
    try:
        text = _dump(value).encode()
    except ValueError:  # NaN or infinity (ijson gives floats out of range as inf)
        return None, problem
    if text.translate(None, _NUMERIC_JSON):
        return None, problem
    return _bounded(text)


def _bounded(text: bytes) -> tuple[bytes | None, str | None]:
    if len(text) > MAX_MASK_BYTES:
        return None, f"segmentation: {len(text):,} bytes of JSON, over {MAX_MASK_BYTES >> 20} MiB"
    return text, None


def attach_images(images: pa.RecordBatch | pa.Table, annotations: pa.RecordBatch | pa.Table) -> pa.Table:
    """The rows of one bucket of image ids, keyed: each annotation row gets the key and the
    declared size of the image row of its image_id.

    Both inputs hold the rows of the same image ids (a bucket of the join: bounded by it),
    from image_rows and annotation_rows. Out: the image rows, then the annotation rows in
    file order. Named failures: an id listed twice in `images` (each of its image rows, so
    that their images fail, and its annotations, which cannot tell their image), and an
    annotation whose image_id is in no image row (key null: reported on its own). Failure
    rows keep their errors and get their image's key where it is known, failing the image.
    """
    images = _table(images)
    annotations = _table(annotations).sort_by("line")
    usable = pc.and_(pc.is_null(images["error"]), pc.is_valid(images["image_id"]))
    counted = pc.value_counts(images["image_id"].filter(usable))
    twice = counted.field("values").filter(pc.greater(counted.field("counts"), 1))
    repeated = pc.and_(usable, pc.is_in(images["image_id"], value_set=twice))
    images = _fail_where(
        images, repeated, lambda line, image_id: f"images[{line}]: image id {image_id} is listed twice"
    )
    unique = images.filter(pc.and_(usable, pc.invert(repeated)))
    index = pc.index_in(annotations["image_id"], value_set=unique["image_id"].combine_chunks())
    for name in ("key", "declared_width", "declared_height"):
        annotations = annotations.set_column(NAMES.index(name), name, unique[name].take(index))
    lost = pc.and_(pc.is_valid(annotations["image_id"]), pc.is_null(index))
    doubled = pc.is_in(annotations["image_id"], value_set=twice).to_numpy(zero_copy_only=False)

    def why(line: int, image_id: int, j: int) -> str:
        problem = "is listed twice in images" if doubled[j] else "is not in images"
        return f"annotations[{line}]: image_id {image_id} {problem}"

    annotations = _fail_where(annotations, lost, why, with_position=True)
    return pa.concat_tables([images, annotations])


def _table(rows: pa.RecordBatch | pa.Table) -> pa.Table:
    return pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows


def _fail_where(rows: pa.Table, where: pa.ChunkedArray, why, with_position: bool = False) -> pa.Table:
    """`rows` with `error` = why(line, image_id[, position]) on the rows `where` is true that
    have none yet (a Python call for those rows only)."""
    picked = np.flatnonzero(pc.fill_null(where, False).to_numpy(zero_copy_only=False))
    if not len(picked):
        return rows
    texts = rows["error"].to_pylist()
    lines, ids = rows["line"].to_pylist(), rows["image_id"].to_pylist()
    for j in picked.tolist():
        if texts[j] is None:
            texts[j] = why(lines[j], ids[j], j) if with_position else why(lines[j], ids[j])
    return rows.set_column(NAMES.index("error"), "error", pa.array(texts, pa.string()))
