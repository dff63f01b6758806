"""Schema presets: which feature keys a record carries, and the parse spec readers use.

A preset turns (record, stored bytes, image info, class index) into a feature dict, and
exports the matching `tf.io.parse_single_example` spec so readers never guess the keys.
`slim` is the default (TF-slim / inception keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from transforms.image import ImageError, ImageInfo
from transforms.labels import ClassIndex
from transforms.records import ImageRecord

FeatureBuilder = Callable[[ImageRecord, bytes, ImageInfo, ClassIndex], dict]


def label_ids(record: ImageRecord, class_index: ClassIndex) -> list[int]:
    """The record's class ids. Raises ImageError for a label missing from the index."""
    try:
        return [class_index.id_of(name) for name in record.labels]
    except KeyError as e:
        raise ImageError(f"label {e.args[0]!r} is not in the class index") from None


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named set of feature keys.

    Attributes:
      name: the preset's `--schema` value.
      build: returns the feature dict of one image.
      kinds: feature name -> 'int64' | 'float' | 'bytes' for every key `build` returns
        (also used for empty lists and for the parse spec).
      image_key / label_key: where the encoded image and the class ids live.
      scalar: keys that always hold exactly one value (FixedLenFeature in the spec).
    """

    name: str
    build: FeatureBuilder
    kinds: dict[str, str]
    image_key: str
    label_key: str
    scalar: frozenset[str]

    def parse_spec(self) -> dict:
        """The `tf.io.parse_single_example` spec for this preset (imports TensorFlow)."""
        import tensorflow as tf

        dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}
        return {
            key: tf.io.FixedLenFeature([], dtypes[kind])
            if key in self.scalar
            else tf.io.VarLenFeature(dtypes[kind])
            for key, kind in self.kinds.items()
        }


def _slim(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    features = {
        "image/encoded": data,
        "image/format": info.format,
        "image/class/label": label_ids(record, class_index),
        "image/class/text": list(record.labels),
        "image/height": info.height,
        "image/width": info.width,
        "image/channels": info.channels,
        "image/colorspace": info.colorspace,
        "image/filename": record.relpath,
    }
    features.update(dict(record.extras))
    return features


SLIM = Schema(
    name="slim",
    build=_slim,
    kinds={
        "image/encoded": "bytes",
        "image/format": "bytes",
        "image/class/label": "int64",
        "image/class/text": "bytes",
        "image/height": "int64",
        "image/width": "int64",
        "image/channels": "int64",
        "image/colorspace": "bytes",
        "image/filename": "bytes",
    },
    image_key="image/encoded",
    label_key="image/class/label",
    scalar=frozenset(
        {
            "image/encoded",
            "image/format",
            "image/height",
            "image/width",
            "image/channels",
            "image/colorspace",
            "image/filename",
        }
    ),
)

PRESETS: dict[str, Schema] = {SLIM.name: SLIM}
DEFAULT_SCHEMA = SLIM.name


def get_schema(name: str) -> Schema:
    """The preset called `name`. Raises ValueError naming the choices."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown schema {name!r} (one of {', '.join(sorted(PRESETS))})") from None
