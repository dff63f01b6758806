"""Encoding one image into a serialized tf.train.Example.

`encode_record` is the pure core (bytes in, bytes out); it is called by WriteShardFn, which
reads each image right before encoding it so that image bytes never enter a PCollection.
"""

from __future__ import annotations

import dataclasses

from transforms.example import serialize_example
from transforms.image import DEFAULT_MAX_PIXELS, ImageError, ImageInfo, inspect_image
from transforms.labels import ClassIndex
from transforms.records import ImageRecord


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """How images are checked and which features are written."""

    max_pixels: int = DEFAULT_MAX_PIXELS


def slim_features(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    """The TF-slim / inception feature set, with the original bytes as `image/encoded`."""
    try:
        ids = [class_index.id_of(name) for name in record.labels]
    except KeyError as e:
        raise ImageError(f"label {e.args[0]!r} is not in the class index") from None
    features = {
        "image/encoded": data,
        "image/format": info.format,
        "image/class/label": ids,
        "image/class/text": list(record.labels),
        "image/height": info.height,
        "image/width": info.width,
        "image/channels": info.channels,
        "image/colorspace": info.colorspace,
        "image/filename": record.relpath,
    }
    features.update(dict(record.extras))
    return features


SLIM_KINDS = {"image/class/label": "int64", "image/class/text": "bytes"}


def encode_record(
    record: ImageRecord,
    data: bytes,
    class_index: ClassIndex,
    settings: EncodeSettings = EncodeSettings(),
) -> bytes:
    """Checks `data` and returns the serialized Example for `record`.

    Raises:
      ImageError: the image does not decode or cannot be written; the message says why.
    """
    info = inspect_image(data, max_pixels=settings.max_pixels)
    return serialize_example(slim_features(record, data, info, class_index), SLIM_KINDS)
