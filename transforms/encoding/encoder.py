"""Encoding one image into a serialized tf.train.Example (pure). The shard writer reads each
image right before encoding it, so image bytes never enter a PCollection.
"""

from __future__ import annotations

import dataclasses
import functools

from transforms.encoding.example import serialize_example_chunks
from transforms.encoding.schema import DEFAULT_SCHEMA, Schema, get_schema
from transforms.images.convert import prepare_image
from transforms.images.jpeg import prepare_kept_jpeg
from transforms.images.types import ImageInfo, ImageOptions, PreparedImage
from transforms.records import ClassIndex, ImageRecord


@dataclasses.dataclass(frozen=True)
class EncodeSettings(ImageOptions):
    """How images are checked and converted (ImageOptions), and which features are written:
    the `--schema` preset and the `--rename_keys` pairs (old, new) applied on top of it."""

    schema: str = DEFAULT_SCHEMA
    rename_keys: tuple[tuple[str, str], ...] = ()


@functools.lru_cache(maxsize=16)
def _schema(name: str, renames: tuple[tuple[str, str], ...]) -> Schema:
    return get_schema(name, renames)


def check_image(data: bytes, settings: ImageOptions = EncodeSettings()) -> PreparedImage:
    """The bytes to store for `data` and what TensorFlow decodes them to: a JPEG kept as it is by
    the structural check of images/jpeg.py, anything else by `prepare_image`. Raises ImageError."""
    return prepare_kept_jpeg(data, settings) or prepare_image(data, settings)


def encode_image_chunks(
    record: ImageRecord, data: bytes, class_index: ClassIndex, settings: EncodeSettings = EncodeSettings()
) -> tuple[list[bytes], ImageInfo]:
    """The serialized Example of `data`, checked and converted as `check_image` does, as chunks
    (the image is not copied into a joined Example), and what TensorFlow decodes its image to.
    Raises ImageError: the image does not decode or cannot be written (the message says why)."""
    schema = _schema(settings.schema, settings.rename_keys)
    prepared = check_image(data, settings)
    features = schema.features(record, prepared.data, prepared.info, class_index)
    return serialize_example_chunks(features, schema.kinds), prepared.info
