"""Encoding one image into a serialized tf.train.Example.

`encode_image` is the pure core (bytes in, bytes out); it is called by WriteShardFn, which
reads each image right before encoding it so that image bytes never enter a PCollection.
"""

from __future__ import annotations

import dataclasses
import functools

from transforms.encoding.example import serialize_example_chunks
from transforms.encoding.schema import DEFAULT_SCHEMA, Schema, get_schema
from transforms.images.check import detect_format
from transforms.images.convert import prepare_image
from transforms.images.integrity import check_structure
from transforms.images.jpeg import prepare_kept_jpeg
from transforms.images.types import ImageInfo, ImageOptions, PreparedImage
from transforms.records import ClassIndex, ImageRecord


@dataclasses.dataclass(frozen=True)
class EncodeSettings(ImageOptions):
    """How images are checked and converted (ImageOptions), and which features are written.

    Attributes:
      schema: the preset name (`--schema`).
      rename_keys: custom key renames (old, new) applied on top of the preset.
    """

    schema: str = DEFAULT_SCHEMA
    rename_keys: tuple[tuple[str, str], ...] = ()


@functools.lru_cache(maxsize=16)
def _schema(name: str, renames: tuple[tuple[str, str], ...]) -> Schema:
    return get_schema(name, renames)


def check_image(data: bytes, settings: ImageOptions = EncodeSettings()) -> PreparedImage:
    """The bytes to store for `data` and what TensorFlow decodes them to (see prepare_image).

    JPEGs kept as they are get the structural check of transforms/images/jpeg.py; everything else
    is decoded by Pillow. Bombs are refused from the header, before anything is decoded.

    Raises:
      ImageError: the image does not decode or cannot be written; the message says why.
    """
    prepared = prepare_kept_jpeg(data, settings) or prepare_image(data, settings)
    check_structure(detect_format(data), data)  # what Pillow forgives but TensorFlow does not
    return prepared


def encode_image(
    record: ImageRecord, data: bytes, class_index: ClassIndex, settings: EncodeSettings = EncodeSettings()
) -> tuple[bytes, ImageInfo]:
    """Checks (and converts, if needed or asked for) `data`.

    Returns:
      The serialized Example and what TensorFlow will decode its stored image to.

    Raises:
      ImageError: the image does not decode or cannot be written; the message says why.
    """
    chunks, info = encode_image_chunks(record, data, class_index, settings)
    return b"".join(chunks), info


def encode_image_chunks(
    record: ImageRecord, data: bytes, class_index: ClassIndex, settings: EncodeSettings = EncodeSettings()
) -> tuple[list[bytes], ImageInfo]:
    """`encode_image` with the Example as chunks (see `serialize_example_chunks`): the
    image bytes are not copied into a joined Example, the shard writer writes the chunks."""
    schema = _schema(settings.schema, settings.rename_keys)
    prepared = check_image(data, settings)
    features = schema.features(record, prepared.data, prepared.info, class_index)
    return serialize_example_chunks(features, schema.kinds), prepared.info
