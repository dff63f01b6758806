"""Encoding one image into a serialized tf.train.Example.

`encode_record` is the pure core (bytes in, bytes out); it is called by WriteShardFn, which
reads each image right before encoding it so that image bytes never enter a PCollection.
"""

from __future__ import annotations

import dataclasses

from transforms.example import serialize_example
from transforms.image import DEFAULT_MAX_PIXELS, inspect_image
from transforms.integrity import check_structure
from transforms.labels import ClassIndex
from transforms.records import ImageRecord
from transforms.schema import DEFAULT_SCHEMA, get_schema


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """How images are checked and which features are written."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    schema: str = DEFAULT_SCHEMA


def encode_record(
    record: ImageRecord, data: bytes, class_index: ClassIndex, settings: EncodeSettings = EncodeSettings()
) -> bytes:
    """Checks `data` and returns the serialized Example for `record`.

    Raises:
      ImageError: the image does not decode or cannot be written; the message says why.
    """
    schema = get_schema(settings.schema)
    info = inspect_image(data, max_pixels=settings.max_pixels)
    check_structure(info.format, data)  # what Pillow forgives but TensorFlow does not
    return serialize_example(schema.build(record, data, info, class_index), schema.kinds)
