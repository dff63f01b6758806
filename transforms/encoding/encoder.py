"""Encoding one image into a serialized tf.train.Example (pure). The shard writer reads each
image right before encoding it, so image bytes never enter a PCollection. A record with objects
(boxes, masks, a class map) has them follow its image's Geometry (encoding/objects.py) and gets
its schema's object keys.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from transforms.encoding.example import serialize_example_chunks
from transforms.encoding.objects import ObjectError, PreparedObjects, prepare_objects
from transforms.encoding.schema import DEFAULT_SCHEMA, Schema, get_schema
from transforms.images.convert import prepare_image
from transforms.images.geometry import Geometry
from transforms.images.jpeg import prepare_kept_jpeg
from transforms.images.types import ImageInfo, ImageOptions, PreparedImage
from transforms.records import ClassIndex, ImageRecord


@dataclasses.dataclass(frozen=True)
class EncodeSettings(ImageOptions):
    """How images are checked and converted (ImageOptions), and which features are written:
    the `--schema` preset and the `--rename_keys` pairs (old, new) applied on top of it; for
    records with objects, `--invalid_boxes`, `--trust_size` and `--masks` (encoding/objects.py)."""

    schema: str = DEFAULT_SCHEMA
    rename_keys: tuple[tuple[str, str], ...] = ()
    invalid_boxes: str = "fail"
    trust_size: str = "fail"
    masks: bool = False


@functools.lru_cache(maxsize=16)
def _schema(
    name: str, renames: tuple[tuple[str, str], ...], objects: tuple[bool, bool] | None = None
) -> Schema:
    return get_schema(name, renames, objects)


def check_image(data: bytes, settings: ImageOptions = EncodeSettings()) -> PreparedImage:
    """The bytes to store for `data` and what TensorFlow decodes them to: a JPEG kept as it is by
    the structural check of images/jpeg.py, anything else by `prepare_image`. Raises ImageError."""
    return prepare_kept_jpeg(data, settings) or prepare_image(data, settings)


def encode_image_chunks(
    record: ImageRecord, data: bytes, class_index: ClassIndex, settings: EncodeSettings = EncodeSettings()
) -> tuple[list[bytes], ImageInfo]:
    """The serialized Example of `data`, checked and converted as `check_image` does, as chunks
    (the image is not copied into a joined Example), and what TensorFlow decodes its image to.
    Raises ImageError: the image does not decode or cannot be written (the message says why);
    ObjectError: its objects cannot be written."""
    chunks, info, _ = encode_example(record, data, class_index, settings)
    return chunks, info


def encode_example(
    record: ImageRecord,
    data: bytes,
    class_index: ClassIndex,
    settings: EncodeSettings = EncodeSettings(),
    read: Callable[[str], bytes] | None = None,
) -> tuple[list[bytes], ImageInfo, PreparedObjects | None]:
    """`encode_image_chunks`, and the record's objects as written (None: it has none).
    `read` reads a segmentation class map the record's objects name."""
    prepared = check_image(data, settings)
    if record.objects is None:
        schema = _schema(settings.schema, settings.rename_keys)
        features = schema.features(record, prepared.data, prepared.info, class_index)
        return serialize_example_chunks(features, schema.kinds), prepared.info, None
    try:
        schema = _schema(settings.schema, settings.rename_keys, (settings.masks, True))
    except ValueError as e:
        raise ObjectError(str(e)) from None
    info = prepared.info
    geometry = prepared.geometry or Geometry.identity(info.width, info.height)
    objects = prepare_objects(
        record.objects,
        geometry,
        class_index,
        invalid_boxes=settings.invalid_boxes,
        trust_size=settings.trust_size,
        masks=settings.masks,
        data=data,
        read=read,
    )
    features = schema.features(record, prepared.data, info, class_index, objects)
    return serialize_example_chunks(features, schema.kinds), info, objects
