"""Schema presets: a preset turns (record, stored bytes, image info, class index) into a feature
dict, and gives the matching `tf.io.parse_single_example` spec so readers never guess the keys:

- `slim` (default): TF-slim / inception keys `image/encoded`, `image/class/label`, ...
- `tutorial`: the TensorFlow TFRecord tutorial's `height, width, depth, label, image_raw`.
- `tfds`: `image`, `label`, `image/filename`, as TFDS `Image`, `ClassLabel` and `Text`.
- `odapi`: the TF Object Detection API's keys with image-level `image/class/*`, ids from 1.

Every preset also carries `image/key/sha256` (hex SHA-256 of the stored image bytes).
`get_schema(name, renames)` applies custom key renames (`--rename_keys old=new,...`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from transforms.images.types import ImageError, ImageInfo
from transforms.listing.archives import source_name
from transforms.records import ClassIndex, ImageRecord

FeatureBuilder = Callable[[ImageRecord, bytes, ImageInfo, ClassIndex], dict]


def label_ids(record: ImageRecord, class_index: ClassIndex) -> list[int]:
    """The record's class ids. Raises ImageError for a label missing from the index."""
    try:
        return [class_index.id_of(name) for name in record.labels]
    except KeyError as e:
        raise ImageError(f"label {e.args[0]!r} is not in the class index") from None


SHA256_KEY = "image/key/sha256"


def content_key(data: bytes) -> str:
    """The hex SHA-256 written as `image/key/sha256` (of the stored image bytes)."""
    return hashlib.sha256(data).hexdigest()


def single_label_id(record: ImageRecord, class_index: ClassIndex, preset: str) -> int:
    """The one class id of a record, for presets whose label is a scalar."""
    ids = label_ids(record, class_index)
    if len(ids) != 1:
        raise ImageError(f"the {preset} schema needs exactly one label per image, got {len(ids)}")
    return ids[0]


def parse_renames(spec: str) -> tuple[tuple[str, str], ...]:
    """Parses 'old=new,old2=new2'. Raises ValueError when malformed."""
    pairs = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        old, sep, new = part.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise ValueError(f"--rename_keys: expected old=new, got {part!r}")
        pairs.append((old.strip(), new.strip()))
    return tuple(pairs)


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named set of feature keys.

    Attributes:
      build: the feature dict of one image (with the preset's own key names).
      kinds: feature name -> 'int64' | 'float' | 'bytes' for every key `build` returns.
      scalar: keys that always hold one value (FixedLenFeature in the spec).
      roles: role (image, label, text, format, height, width, channels, colorspace, filename,
        source_id, sha256) -> feature key, for the roles the preset fills; readers look keys up by role.
      label_offset: the first class id the consumer expects (None: `--label_offset` decides).
      renames: custom key renames (old -> new) applied on top of the preset.
      raw_ok: whether the consumer can read `--store raw` records.
      single_frame: the consumer decodes with `expand_animations=True` (4-D for the formats of
        images.decoding.DECODED_4D_FORMATS), so those are stored as their first frame (PNG).
    """

    name: str
    build: FeatureBuilder
    kinds: dict[str, str]
    image_key: str
    label_key: str
    scalar: frozenset[str]
    roles: dict[str, str] = dataclasses.field(default_factory=dict)
    label_offset: int | None = None
    renames: tuple[tuple[str, str], ...] = ()
    raw_ok: bool = True
    single_frame: bool = False

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

    def features(self, record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
        """The feature dict of one image: the preset's keys, the content hash and the
        record's extra features, with the custom renames applied."""
        features = {
            **self.build(record, data, info, class_index),
            SHA256_KEY: content_key(data),
            **dict(record.extras),
        }
        if not self.renames:
            return features
        mapping = dict(self.renames)
        return {mapping.get(k, k): v for k, v in features.items()}

    def renamed(self, renames: tuple[tuple[str, str], ...]) -> Schema:
        """This preset with keys renamed. Raises ValueError for unknown or clashing keys."""
        if not renames:
            return self
        mapping = dict(self.renames)
        for old, new in renames:
            if old not in self.kinds:
                raise ValueError(f"--rename_keys: {old!r} is not a key of the {self.name} schema")
            mapping[old] = new
        new_keys = [mapping.get(k, k) for k in self.kinds]
        if len(set(new_keys)) != len(new_keys):
            raise ValueError("--rename_keys: two features would get the same key")

        def rename(k: str) -> str:
            return mapping.get(k, k)

        return dataclasses.replace(
            self,
            kinds={rename(k): v for k, v in self.kinds.items()},
            image_key=rename(self.image_key),
            label_key=rename(self.label_key),
            scalar=frozenset(rename(k) for k in self.scalar),
            roles={r: rename(k) for r, k in self.roles.items()},
            renames=tuple(sorted(mapping.items())),
        )


def preset(
    name: str, build: FeatureBuilder, keys: dict[str, tuple[str, str]], lists: frozenset = frozenset(), **kw
) -> Schema:
    """A Schema of `keys` (role -> (key, kind)) plus `image/key/sha256`; all but `lists` are scalar."""
    keys = {**keys, "sha256": (SHA256_KEY, "bytes")}
    kinds = dict(keys.values())
    roles = {role: key for role, (key, _) in keys.items()}
    return Schema(
        name=name,
        build=build,
        kinds=kinds,
        image_key=roles["image"],
        label_key=roles["label"],
        scalar=frozenset(kinds) - lists,
        roles=roles,
        **kw,
    )


def _slim(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    return {
        "image/encoded": data,
        "image/format": info.format,
        "image/class/label": label_ids(record, class_index),
        "image/class/text": list(record.labels),
        "image/height": info.height,
        "image/width": info.width,
        "image/channels": info.channels,
        "image/colorspace": info.colorspace,
        "image/filename": source_name(record.path, record.relpath),
    }


# role -> (key, kind): the TF-slim / inception keys.
_SLIM = {
    "image": ("image/encoded", "bytes"),
    "format": ("image/format", "bytes"),
    "label": ("image/class/label", "int64"),
    "text": ("image/class/text", "bytes"),
    "height": ("image/height", "int64"),
    "width": ("image/width", "int64"),
    "channels": ("image/channels", "int64"),
    "colorspace": ("image/colorspace", "bytes"),
    "filename": ("image/filename", "bytes"),
}
_LISTS = frozenset({"image/class/label", "image/class/text"})
SLIM = preset("slim", _slim, _SLIM, _LISTS)


def _tutorial(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    return {
        "height": info.height,
        "width": info.width,
        "depth": info.channels,
        "label": single_label_id(record, class_index, "tutorial"),
        "image_raw": data,
    }


# The TensorFlow TFRecord tutorial's keys (tensorflow.org/tutorials/load_data/tfrecord).
TUTORIAL = preset(
    "tutorial",
    _tutorial,
    {
        "height": ("height", "int64"),
        "width": ("width", "int64"),
        "channels": ("depth", "int64"),
        "label": ("label", "int64"),
        "image": ("image_raw", "bytes"),
    },
)


def _tfds(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    return {
        "image": data,
        "label": single_label_id(record, class_index, "tfds"),
        "image/filename": source_name(record.path, record.relpath),
    }


# TFDS's ImageFolder features: `image` (tfds.features.Image), `label` (ClassLabel, ids
# from 0) and `image/filename` (Text). TFDS parses only the keys it declares.
TFDS = preset(
    "tfds",
    _tfds,
    {"image": ("image", "bytes"), "label": ("label", "int64"), "filename": ("image/filename", "bytes")},
    label_offset=0,
    raw_ok=False,
    single_frame=True,  # tfds.features.Image decodes with expand_animations=True
)


def _odapi(record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex) -> dict:
    features = _slim(record, data, info, class_index)
    del features["image/channels"], features["image/colorspace"]
    return {**features, "image/source_id": source_name(record.path, record.relpath)}


# The keys of object_detection/core/standard_fields.py TfExampleFields that exist
# without boxes; ODAPI label maps start at id 1 (0 is the background).
ODAPI = preset(
    "odapi",
    _odapi,
    {
        **{role: key for role, key in _SLIM.items() if role not in ("channels", "colorspace")},
        "source_id": ("image/source_id", "bytes"),
    },
    _LISTS,
    label_offset=1,
    raw_ok=False,
    single_frame=True,  # tf-slim's decoder falls back to decode_image for GIF and WebP
)

PRESETS: dict[str, Schema] = {s.name: s for s in (SLIM, TUTORIAL, TFDS, ODAPI)}
DEFAULT_SCHEMA = SLIM.name


def get_schema(name: str, renames: tuple[tuple[str, str], ...] | dict[str, str] = ()) -> Schema:
    """The preset called `name`, with custom key renames applied.
    Raises ValueError: unknown preset (the message names the choices) or bad renames."""
    if name not in PRESETS:
        raise ValueError(f"unknown schema {name!r} (one of {', '.join(sorted(PRESETS))})")
    return PRESETS[name].renamed(tuple(dict(renames).items()))


def schema_from_summary(summary: dict) -> Schema:
    """The schema a dataset was written with, from its summary.json document."""
    return get_schema(summary.get("schema", DEFAULT_SCHEMA), summary.get("rename_keys") or {})
