"""Checking written shards: framing, CRCs, Example parsing, image decoding, index files.

`check_shard` reads one shard record by record (`iter_records`), parses every Example with
the dataset's spec (its DatasetFormat: schema with renames, store mode), decodes a sample of
the images (or all) as the dataset's readers do, and counts records and bytes per class. An
image must decode as `load_dataset` decodes it (raw pixels: exactly height x width x channels
bytes) to the stored shape and, when a reader decodes with `expand_animations=True` (TFDS's
`Image`, the tfds/odapi presets), to 3-D; for those readers every record is also checked for a
format of DECODED_4D_FORMATS. Records with objects: every object key holds one value an object,
every box lies in [0, 1] with min <= max, and every instance mask and class map decodes at the
image's size; the objects are counted per class and COCO size (`object_size`) and the records
without any. It stops at the first bad record and reports its byte offset.
beam.py runs it one shard per element; `inspect` uses it for its statistics and samples.
Memory: counters, and the kept samples (`samples_per_class` a class).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import zlib

from apache_beam.io.filesystem import CompressionTypes

from transforms import gcs
from transforms.encoding.dataset_format import DatasetFormat
from transforms.encoding.tfrecord import RECORD_OVERHEAD, RecordError, iter_records
from transforms.images.check import detect_format
from transforms.images.decoding import decodes_4d, raw_size
from transforms.writing.index import index_path, parse_index

_PARSE_BATCH = 256
# COCO's object sizes (cocodataset.org/#detection-eval: small < 32², medium < 96², else large),
# by the object's area in the written image's pixels.
OBJECT_SIZES = (("small", 32**2), ("medium", 96**2), ("large", float("inf")))


def object_size(area: float) -> str:
    """The COCO size of an object of `area` pixels: 'small', 'medium' or 'large'."""
    return next(name for name, below in OBJECT_SIZES if area < below)


@dataclasses.dataclass(frozen=True)
class SampleObjects:
    """A sample's objects, to draw on its thumbnail: boxes as fractions of the image (xmin, ymin,
    xmax, ymax), the class index of each (position in the class names), the instance masks and
    the class map as the record holds them (PNG bytes)."""

    boxes: tuple[tuple[float, float, float, float], ...] = ()
    classes: tuple[int, ...] = ()
    masks: tuple[bytes, ...] = ()
    class_map: bytes | None = None


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    """What one shard holds, and the first problem found in it.

    `records` and `bytes` (serialized Examples) count the records before the first problem
    (`error`, at byte `offset` of the uncompressed stream). `classes`: (class key, records,
    bytes), sorted. `samples`: (class key, encoded image (raw pixels as PNG), file name or '',
    SampleObjects or None) of up to `samples_per_class` images a class; with objects the class
    keys are the objects' classes (an image is kept for each class it shows) and None for an
    image without objects. `formats`, `widths`, `heights`: (image format or size_bucket,
    records), sorted, when the schema has the key. With objects, `objects`: (object class,
    COCO size, objects), sorted, and `background`: the records without objects.
    """

    path: str
    records: int = 0
    bytes: int = 0
    decoded: int = 0
    error: str | None = None
    offset: int | None = None
    classes: tuple[tuple[str, int, int], ...] = ()
    samples: tuple[tuple[str | None, bytes, str, SampleObjects | None], ...] = ()
    formats: tuple[tuple[str, int], ...] = ()
    widths: tuple[tuple[int, int], ...] = ()
    heights: tuple[tuple[int, int], ...] = ()
    objects: tuple[tuple[str, str, int], ...] = ()
    background: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("samples")
        if not self.objects and not self.background:  # no objects (classification): as before
            d.pop("objects")
            d.pop("background")
        return json.dumps(d, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ShardCheck:
        d = json.loads(text)
        for key in ("classes", "formats", "widths", "heights", "objects"):
            d[key] = tuple(tuple(x) for x in d.get(key, ()))
        return cls(**d)


def size_bucket(pixels: int) -> int:
    """The distribution bucket of an image side, named by its largest side: 16 for up to 16,
    then four a doubling (..., 193-224, 225-256, 257-320, ..., 1025-1280, 1281-1536, ...), so
    common sizes (224, 256, 384, 512, 640, 768, 1024, 1280, 2048) end a bucket."""
    if pixels <= 16:
        return 16
    below = 1 << ((pixels - 1).bit_length() - 1)  # the largest power of two under `pixels`
    step = below // 4
    return below + step * -(-(pixels - below) // step)


def bucket_sides(bucket: int) -> tuple[int, int]:
    """(smallest, largest) side of a size_bucket."""
    if bucket <= 16:
        return 1, 16
    below = 1 << ((bucket - 1).bit_length() - 1)
    return bucket - below // 4 + 1, bucket


class _Checker:
    """Parses and decodes the records of one shard in batches (TensorFlow ops)."""

    def __init__(
        self, fmt: DatasetFormat, class_names: list[str], offset: int, decode_all: bool, samples: int
    ):
        import tensorflow as tf

        self._tf = tf
        self._fmt, self._schema = fmt, fmt.schema
        self._names, self._offset = class_names, offset
        self._spec = self._schema.parse_spec()
        self._decode_all, self._samples = decode_all, samples
        # Keys whose value the decoded image must match, in (height, width, channels) order.
        self._shape_keys = list(fmt.shape_keys())
        self._strict = fmt.animation_readers()
        # Optional keys read for inspect's distributions and captions (role -> key).
        self._info_keys = {
            role: self._schema.roles[role]
            for role in ("format", "width", "height", "filename")
            if self._schema.roles.get(role) in self._schema.kinds
        }
        # Objects: the summary's class key is the image-level label (absent in TFDS's detection
        # data); the box and mask keys checked in every record.
        objects = self._schema.object_roles
        self._class_key = self._schema.roles.get("label") if objects else self._schema.label_key
        self._box_keys = [objects[r] for r in ("boxes", "xmin", "ymin", "xmax", "ymax") if r in objects]
        self._mask_key, self._map_key = objects.get("masks"), objects.get("class_map")
        # One value an object: the keys that must hold as many values as there are boxes (the
        # area may hold none: the OD API's readers take the box's area then, and so does inspect).
        self._per_object = [objects[r] for r in ("label", "area") if r in objects]
        self._area_key = objects.get("area")  # every preset with objects has one
        # Records by format, width and height bucket; records, bytes and samples kept by class;
        # objects by (class, size).
        counters = (collections.Counter() for _ in range(7))
        self.formats, self.widths, self.heights, self.counts, self.sizes, self._kept_per_class = (
            next(counters) for _ in range(6)
        )
        self.objects = next(counters)
        self.background = 0
        self.kept: list[tuple[str | None, bytes, str, SampleObjects | None]] = []
        self.decoded = 0

    def check(self, batch: list[tuple[int, int, bytes]]) -> None:
        """Checks (index, offset, data) records. Raises RecordError for the first bad one."""
        if not batch:
            return
        try:
            rows = self._parse([d for _, _, d in batch])
        except self._tf.errors.InvalidArgumentError:
            rows = []
            for _, offset, data in batch:  # find which record does not parse
                try:
                    rows += self._parse([data])
                except self._tf.errors.InvalidArgumentError as e:
                    raise RecordError(offset, f"Example does not parse: {_first_line(e.message)}") from None
        for (i, offset, data), ex in zip(batch, rows, strict=True):
            ids = ex[self._schema.label_key]
            ids = ids if isinstance(ids, list) else [ids]
            if any(not 0 <= x - self._offset < len(self._names) for x in ids):
                raise RecordError(
                    offset, f"label ids {ids} outside the {len(self._names)} classes of summary.json"
                )
            if self._strict and not self._fmt.raw:  # every record, without decoding
                fmt = detect_format(ex[self._schema.image_key])
                if decodes_4d(fmt):
                    readers = " and ".join(self._strict)
                    raise RecordError(
                        offset, f"{fmt} image, which {readers} decode to 4-D (expand_animations=True)"
                    )
            sample_keys: list[str | None]
            if self._box_keys:
                boxes = self._check_objects(ex, offset)
                classes = [int(x) - self._offset for x in ids]  # the objects' classes
                self._count_objects(ex, classes, boxes, offset)
                # Samples by the objects' classes (an image for each class it shows; None: no objects).
                sample_keys = list(dict.fromkeys(self._names[c] for c in classes)) if classes else [None]
                ids = ex.get(self._class_key, []) if self._class_key else []  # the image-level labels
            key = "|".join(self._names[int(x) - self._offset] for x in ids)  # the summary's class key
            if not self._box_keys:
                sample_keys = [key]
            self.counts[key] += 1
            self.sizes[key] += len(data)
            self._count_info(ex)
            wanted = [k for k in sample_keys if self._kept_per_class[k] < self._samples]
            sampled = i < 2 or not i & (i - 1)  # decoded by default: 0, 1, 2, 4, 8, 16, ...
            if self._decode_all or sampled or wanted:
                encoded = ex[self._schema.image_key]
                image = self._decode(ex, encoded, offset)
                if wanted:
                    name = ex.get(self._info_keys.get("filename"), b"").decode("utf-8", "replace")
                    stored = _png(image) if self._fmt.raw else encoded
                    drawn = self._sample_objects(ex, boxes, classes) if self._box_keys else None
                    for k in wanted:
                        self.kept.append((k, stored, name, drawn))
                        self._kept_per_class[k] += 1

    def _check_objects(self, ex: dict, offset: int):
        """The record's boxes (n, 4: xmin, ymin, xmax, ymax fractions), checked with its masks
        and class map (RecordError)."""
        boxes = _check_boxes(ex, self._box_keys, offset)
        for key in self._per_object:
            if len(ex[key]) != len(boxes) and not (key == self._area_key and not ex[key]):
                raise RecordError(offset, f"{key} holds {len(ex[key])} values for {len(boxes)} boxes")
        masks = ex[self._mask_key] if self._mask_key else []
        if len(masks) != (len(boxes) if self._mask_key else 0):
            raise RecordError(offset, f"{len(masks)} masks for {len(boxes)} boxes")
        rasters = [(f"mask {i}", png) for i, png in enumerate(masks)]
        rasters += [("class map", png) for png in (ex[self._map_key] if self._map_key else [])]
        if rasters:
            size = self._image_size(ex, offset)
            for what, png in rasters:
                _check_raster(png, what, size, offset)
        return boxes

    def _image_size(self, ex: dict, offset: int) -> tuple[int, int]:
        """(height, width) of the record's image: its height and width keys, or (a schema without
        them: tfds) the encoded image's header."""
        if len(self._shape_keys) >= 2:
            return ex[self._shape_keys[0]], ex[self._shape_keys[1]]
        from PIL import Image

        try:
            with Image.open(io.BytesIO(ex[self._schema.image_key])) as img:
                return img.height, img.width
        except Exception as e:  # noqa: BLE001 - any decode error is the record's problem
            raise RecordError(offset, f"image does not decode: {e}") from None

    def _count_objects(self, ex: dict, classes: list[int], boxes, offset: int) -> None:
        """Counts the objects by class and COCO size (their area, else their box's, in pixels)."""
        if not classes:
            self.background += 1
            return
        areas = ex[self._area_key]
        if not areas:
            height, width = self._image_size(ex, offset)
            areas = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) * width * height).tolist()
        for c, area in zip(classes, areas, strict=True):
            self.objects[(self._names[c], object_size(area))] += 1

    def _sample_objects(self, ex: dict, boxes, classes: list[int]) -> SampleObjects:
        masks = tuple(ex[self._mask_key]) if self._mask_key else ()
        class_map = ex[self._map_key][0] if self._map_key and ex[self._map_key] else None
        return SampleObjects(tuple(map(tuple, boxes.tolist())), tuple(classes), masks, class_map)

    def _count_info(self, ex: dict) -> None:
        keys = self._info_keys
        if "format" in keys:
            self.formats[ex[keys["format"]].decode("utf-8", "replace") or "?"] += 1
        if "width" in keys:
            self.widths[size_bucket(ex[keys["width"]])] += 1
        if "height" in keys:
            self.heights[size_bucket(ex[keys["height"]])] += 1

    def _parse(self, serialized: list[bytes]) -> list[dict]:
        """Parses a batch; returns per record the values of the keys the checks need."""
        tf, schema = self._tf, self._schema
        parsed = tf.io.parse_example(serialized, self._spec)
        columns = {}
        objects = (*self._box_keys, *self._per_object, *filter(None, (self._mask_key, self._map_key)))
        objects += (self._class_key,) if self._class_key else ()
        for key in dict.fromkeys(
            (schema.image_key, schema.label_key, *self._shape_keys, *self._info_keys.values(), *objects)
        ):
            value = parsed[key]
            sparse = isinstance(value, tf.SparseTensor)
            columns[key] = tf.RaggedTensor.from_sparse(value).to_list() if sparse else value.numpy().tolist()
        return [{k: v[row] for k, v in columns.items()} for row in range(len(serialized))]

    def _decode(self, ex: dict, encoded: bytes, offset: int):
        """Decodes one image as the dataset's readers do; returns it (uint8, H x W x C)."""
        tf = self._tf
        if self._fmt.raw:
            image = self._raw(ex, encoded, offset)
        else:
            try:
                # With the default expand_animations=True when a reader decodes so (a 4-D
                # result is then a problem); its first frame is what load_dataset gets.
                image = tf.io.decode_image(encoded, expand_animations=bool(self._strict))
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                raise RecordError(offset, f"image does not decode: {_first_line(str(e))}") from None
            if len(image.shape) == 4:
                raise RecordError(
                    offset,
                    f"image decodes to 4-D {tuple(image.shape)} in {' and '.join(self._strict)} "
                    "(decode_image with expand_animations=True)",
                )
        self.decoded += 1
        for key, got in zip(self._shape_keys, image.shape, strict=False):
            want = ex[key]
            if want != got:
                raise RecordError(offset, f"{key} is {want} but the image decodes to {tuple(image.shape)}")
        return image

    def _raw(self, ex: dict, data: bytes, offset: int):
        """Raw uint8 pixels reshaped by the stored height, width and channels (as load_dataset does)."""
        import numpy as np

        shape = tuple(ex[k] for k in self._shape_keys)
        if min(shape) < 1 or len(data) != raw_size(*shape):
            raise RecordError(
                offset, f"raw pixels are {len(data)} bytes, not height x width x channels {shape}"
            )
        return np.frombuffer(data, np.uint8).reshape(shape)


def _check_boxes(ex: dict, box_keys: list[str], offset: int):
    """The record's boxes (n, 4: xmin, ymin, xmax, ymax). Raises RecordError: box keys of
    different lengths, or a box outside [0, 1] or with min > max."""
    import numpy as np

    if len(box_keys) == 1:  # TFDS's [ymin, xmin, ymax, xmax] rows
        values = ex[box_keys[0]]
        if len(values) % 4:
            raise RecordError(offset, f"{box_keys[0]} holds {len(values)} values, not 4 a box")
        boxes = np.asarray(values, np.float64).reshape(-1, 4)[:, [1, 0, 3, 2]]
    else:
        lengths = {k: len(ex[k]) for k in box_keys}
        if len(set(lengths.values())) > 1:
            raise RecordError(offset, f"box keys of different lengths: {lengths}")
        boxes = np.asarray([ex[k] for k in box_keys], np.float64).T.reshape(-1, 4)
    if len(boxes) and (
        not np.isfinite(boxes).all()
        or (boxes < 0).any()
        or (boxes > 1).any()
        or (boxes[:, 0] > boxes[:, 2]).any()
        or (boxes[:, 1] > boxes[:, 3]).any()
    ):
        bad = next(b for b in boxes.tolist() if not (0 <= b[0] <= b[2] <= 1 and 0 <= b[1] <= b[3] <= 1))
        raise RecordError(offset, f"box {bad} (xmin, ymin, xmax, ymax) is not within [0, 1] with min <= max")
    return boxes


def _check_raster(png: bytes, what: str, size: tuple[int, int], offset: int) -> None:
    """Raises RecordError: the PNG `png` (a mask or class map) does not decode at the image's
    (height, width) `size`."""
    from PIL import Image

    try:
        raster = Image.open(io.BytesIO(png), formats=("PNG",))
        raster.load()
    except Exception as e:  # noqa: BLE001 - any decode error is the record's problem
        raise RecordError(offset, f"{what} does not decode as PNG ({e})") from None
    if (raster.height, raster.width) != tuple(size):
        raise RecordError(offset, f"{what} is {raster.width}x{raster.height}, the image {size[1]}x{size[0]}")


def _png(image) -> bytes:
    """PNG bytes of a uint8 (H, W, C) image (raw samples for inspect's report)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(image)
    img = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)  # L, LA, RGB, RGBA
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def check_index(path: str, offsets: list[tuple[int, int]]) -> None:
    """Compares `<path>.idx` (if any) with the records' real (offset, length); raises
    RecordError at the first record the index gets wrong."""
    idx = index_path(path)
    if not gcs.exists(idx):
        return
    with gcs.open_read(idx, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        entries = parse_index(f.read().decode("ascii"))
    for want, got in zip(offsets, entries, strict=False):
        if want != got:
            raise RecordError(want[0], f"index file says {got}, record is {want}")
    if len(entries) != len(offsets):
        at = offsets[len(entries)][0] if len(entries) < len(offsets) else sum(offsets[-1]) if offsets else 0
        raise RecordError(at, f"index file has {len(entries)} entries for {len(offsets)} records")


def check_shard(
    path: str,
    fmt: DatasetFormat,
    class_names: list[str],
    offset: int = 0,
    *,
    decode_all: bool = False,
    samples_per_class: int = 0,
) -> ShardCheck:
    """Reads and checks every record of one shard (local or gs://, gzip by suffix)."""
    checker = _Checker(fmt, class_names, offset, decode_all, samples_per_class)
    positions: list[tuple[int, int]] = []  # (offset, length) of every record read
    batch: list[tuple[int, int, bytes]] = []
    error = bad_offset = None
    try:
        with gcs.open_read(path, compression_type=CompressionTypes.AUTO) as f:
            try:
                for i, (at, data) in enumerate(iter_records(f)):
                    positions.append((at, len(data) + RECORD_OVERHEAD))
                    batch.append((i, at, data))
                    if len(batch) == _PARSE_BATCH:
                        checker.check(batch)
                        batch = []
            except (EOFError, zlib.error, OSError) as e:  # a broken gzip stream
                end = positions[-1][0] + positions[-1][1] if positions else 0
                raise RecordError(end, f"compressed stream broken: {e}") from None
        checker.check(batch)
        check_index(path, positions)
    except RecordError as e:
        error, bad_offset = e.reason, e.offset
    good = [length - RECORD_OVERHEAD for at, length in positions if bad_offset is None or at < bad_offset]
    return ShardCheck(
        path=path,
        records=len(good),
        bytes=sum(good),
        decoded=checker.decoded,
        error=error,
        offset=bad_offset,
        classes=tuple(sorted((k, n, checker.sizes[k]) for k, n in checker.counts.items())),
        samples=tuple(checker.kept),
        formats=tuple(sorted(checker.formats.items())),
        widths=tuple(sorted(checker.widths.items())),
        heights=tuple(sorted(checker.heights.items())),
        objects=tuple(sorted((c, size, n) for (c, size), n in checker.objects.items())),
        background=checker.background,
    )
