"""Checking written shards: framing, CRCs, Example parsing, image decoding, index files.

`check_shard` reads one shard record by record (`iter_records`), parses every Example with
the dataset's spec (its DatasetFormat: schema with renames, store mode), decodes a sample of
the images (or all) as the dataset's readers do, and counts records and bytes per class. An
image must decode as `load_dataset` decodes it (raw pixels: exactly height x width x channels
bytes) to the stored shape and, when a reader decodes with `expand_animations=True` (TFDS's
`Image`, the tfds/odapi presets), to 3-D; for those readers every record is also checked for a
format of DECODED_4D_FORMATS. Records with objects: every box lies in [0, 1] with min <= max,
and every instance mask decodes at the image's size. It stops at the first bad record and reports
its byte offset.
beam.py runs it one shard per element; `inspect` uses it for its statistics and samples.
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


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    """What one shard holds, and the first problem found in it.

    `records` and `bytes` (serialized Examples) count the records before the first problem
    (`error`, at byte `offset` of the uncompressed stream). `classes`: (class key, records,
    bytes), sorted. `samples`: (class key, encoded image (raw pixels as PNG), file name or '')
    of up to `samples_per_class` images a class. `formats`, `widths`, `heights`: (image format
    or size_bucket, records), sorted, when the schema has the key.
    """

    path: str
    records: int = 0
    bytes: int = 0
    decoded: int = 0
    error: str | None = None
    offset: int | None = None
    classes: tuple[tuple[str, int, int], ...] = ()
    samples: tuple[tuple[str, bytes, str], ...] = ()
    formats: tuple[tuple[str, int], ...] = ()
    widths: tuple[tuple[int, int], ...] = ()
    heights: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("samples")
        return json.dumps(d, ensure_ascii=False)


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
        self._mask_key = objects.get("masks")
        # Records by format, width and height bucket; records, bytes and samples kept by class.
        self.formats, self.widths, self.heights, self.counts, self.sizes, self._kept_per_class = (
            collections.Counter() for _ in range(6)
        )
        self.kept: list[tuple[str, bytes, str]] = []
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
            if self._box_keys:
                _check_objects(ex, self._box_keys, self._mask_key, self._shape_keys, offset)
            if self._class_key != self._schema.label_key:  # objects: the image-level labels
                ids = ex.get(self._class_key, []) if self._class_key else []
            key = "|".join(self._names[int(x) - self._offset] for x in ids)  # the summary's class key
            self.counts[key] += 1
            self.sizes[key] += len(data)
            self._count_info(ex)
            want_sample = self._kept_per_class[key] < self._samples
            sampled = i < 2 or not i & (i - 1)  # decoded by default: 0, 1, 2, 4, 8, 16, ...
            if self._decode_all or sampled or want_sample:
                encoded = ex[self._schema.image_key]
                image = self._decode(ex, encoded, offset)
                if want_sample:
                    name = ex.get(self._info_keys.get("filename"), b"")
                    stored = _png(image) if self._fmt.raw else encoded
                    self.kept.append((key, stored, name.decode("utf-8", "replace")))
                    self._kept_per_class[key] += 1

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
        objects = (*self._box_keys, *filter(None, (self._mask_key, self._class_key)))
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


def _check_objects(
    ex: dict, box_keys: list[str], mask_key: str | None, shape_keys: list[str], offset: int
) -> None:
    """Raises RecordError: a box outside [0, 1] or with min > max, or a mask that does not decode
    at the image's height and width."""
    import numpy as np

    if len(box_keys) == 1:  # TFDS's [ymin, xmin, ymax, xmax] rows
        boxes = np.asarray(ex[box_keys[0]], np.float64).reshape(-1, 4)[:, [1, 0, 3, 2]]
    else:
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
    if mask_key is None:
        return
    from PIL import Image

    want = tuple(ex[k] for k in shape_keys[:2])
    masks = ex[mask_key]
    if len(masks) != len(boxes):
        raise RecordError(offset, f"{len(masks)} masks for {len(boxes)} boxes")
    for i, png in enumerate(masks):
        try:
            mask = Image.open(io.BytesIO(png), formats=("PNG",))
            mask.load()
        except Exception as e:  # noqa: BLE001 - any decode error is the record's problem
            raise RecordError(offset, f"mask {i} does not decode as PNG ({e})") from None
        if (mask.height, mask.width) != want:
            raise RecordError(
                offset, f"mask {i} is {mask.width}x{mask.height}, the image {want[1]}x{want[0]}"
            )


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
    )
