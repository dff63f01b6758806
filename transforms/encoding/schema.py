"""Schema presets: a preset turns (record, stored bytes, image info, class index) into a feature
dict, and exports the matching `tf.io.parse_single_example` spec so readers never guess the keys:

- `slim` (default): TF-slim / inception keys `image/encoded`, `image/class/label`, ...
- `tutorial`: the TensorFlow TFRecord tutorial's `height, width, depth, label, image_raw`.
- `tfds`: `image`, `label`, `image/filename`, as TFDS `Image`, `ClassLabel` and `Text`.
- `odapi`: the TF Object Detection API's keys with image-level `image/class/*`, ids from 1.

Every preset also carries `image/key/sha256` (hex SHA-256 of the stored image bytes).
`get_schema(name, renames)` applies custom key renames (`--rename_keys old=new,...`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from transforms.images.types import ImageError, ImageInfo
from transforms.listing.archives import source_name
from transforms.records import ClassIndex, ImageRecord

SHA256_KEY = "image/key/sha256"


def content_key(data: bytes) -> str:
    """The hex SHA-256 written as `image/key/sha256` (of the stored image bytes)."""
    return hashlib.sha256(data).hexdigest()


def parse_renames(spec: str) -> tuple[tuple[str, str], ...]:
    """Parses 'old=new,old2=new2'. Raises ValueError when malformed."""
    pairs = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        old, sep, new = part.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise ValueError(f"--rename_keys: expected old=new, got {part!r}")
        pairs.append((old.strip(), new.strip()))
    return tuple(pairs)


# The kind of each role's value.
_KINDS = {
    "image": "bytes",
    "format": "bytes",
    "label": "int64",
    "text": "bytes",
    "height": "int64",
    "width": "int64",
    "channels": "int64",
    "colorspace": "bytes",
    "filename": "bytes",
    "source_id": "bytes",
    "sha256": "bytes",
}


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named set of feature keys.

    Attributes:
      name: the preset's `--schema` value.
      roles: role (a key of `_KINDS`) -> feature key, for the roles the preset fills, in the
        preset's key order; readers look keys up by role.
      multi_label: the class ids and names are lists (else one id per image, a scalar).
      label_offset: the id of the first class this preset's consumer expects, or None
        when `--label_offset` decides (tfds: 0, odapi: 1).
      renames: custom key renames (old -> new) applied on top of the preset.
      raw_ok: whether the consumer can read `--store raw` records.
      single_frame: the consumer decodes with `expand_animations=True` (a 4-D tensor for
        every GIF and WebP: images/decoding.py DECODED_4D_FORMATS), so those formats are
        stored as their first frame (PNG).
    """

    name: str
    roles: dict[str, str]
    multi_label: bool = False
    label_offset: int | None = None
    renames: tuple[tuple[str, str], ...] = ()
    raw_ok: bool = True
    single_frame: bool = False

    @property
    def image_key(self) -> str:
        return self.roles["image"]

    @property
    def label_key(self) -> str:
        return self.roles["label"]

    @functools.cached_property
    def kinds(self) -> dict[str, str]:
        """Feature key -> 'int64' | 'float' | 'bytes' (also for empty lists and the parse spec)."""
        return {key: _KINDS[role] for role, key in self.roles.items()}

    @functools.cached_property
    def scalar(self) -> frozenset[str]:
        """Keys that always hold exactly one value (FixedLenFeature in the spec)."""
        lists = ("label", "text") if self.multi_label else ()
        return frozenset(key for role, key in self.roles.items() if role not in lists)

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
        """The feature dict of one image: the preset's keys (renamed) and the record's extra
        features (renamed too, should they have a preset key's name)."""
        try:
            labels = [class_index.id_of(name) for name in record.labels]
        except KeyError as e:
            raise ImageError(f"label {e.args[0]!r} is not in the class index") from None
        if not self.multi_label:
            if len(labels) != 1:
                raise ImageError(
                    f"the {self.name} schema needs exactly one label per image, got {len(labels)}"
                )
            labels = labels[0]
        name = (
            source_name(record.path, record.relpath)
            if "filename" in self.roles or "source_id" in self.roles
            else None
        )
        values = {
            "image": data,
            "format": info.format,
            "label": labels,
            "text": list(record.labels),
            "height": info.height,
            "width": info.width,
            "channels": info.channels,
            "colorspace": info.colorspace,
            "filename": name,
            "source_id": name,
            "sha256": content_key(data),
        }
        features = {key: values[role] for role, key in self.roles.items()}
        if not self.renames:
            return {**features, **dict(record.extras)}
        mapping = dict(self.renames)
        return {**features, **{mapping.get(k, k): v for k, v in record.extras}}

    def renamed(self, renames: tuple[tuple[str, str], ...]) -> Schema:
        """This preset with keys renamed. Raises ValueError for unknown or clashing keys."""
        if not renames:
            return self
        mapping = dict(self.renames)
        for old, new in renames:
            if old not in self.kinds:
                raise ValueError(f"--rename_keys: {old!r} is not a key of the {self.name} schema")
            mapping[old] = new
        roles = {role: mapping.get(key, key) for role, key in self.roles.items()}
        if len(set(roles.values())) != len(roles):
            raise ValueError("--rename_keys: two features would get the same key")
        return dataclasses.replace(self, roles=roles, renames=tuple(sorted(mapping.items())))


# The TF-slim / inception keys.
SLIM = Schema(
    "slim",
    {
        "image": "image/encoded",
        "format": "image/format",
        "label": "image/class/label",
        "text": "image/class/text",
        "height": "image/height",
        "width": "image/width",
        "channels": "image/channels",
        "colorspace": "image/colorspace",
        "filename": "image/filename",
        "sha256": SHA256_KEY,
    },
    multi_label=True,
)
# The TensorFlow TFRecord tutorial's keys (tensorflow.org/tutorials/load_data/tfrecord).
TUTORIAL = Schema(
    "tutorial",
    {
        "height": "height",
        "width": "width",
        "channels": "depth",
        "label": "label",
        "image": "image_raw",
        "sha256": SHA256_KEY,
    },
)
# TFDS's ImageFolder features: `image` (tfds.features.Image), `label` (ClassLabel, ids
# from 0) and `image/filename` (Text). TFDS parses only the keys it declares.
TFDS = Schema(
    "tfds",
    {"image": "image", "label": "label", "filename": "image/filename", "sha256": SHA256_KEY},
    label_offset=0,
    raw_ok=False,
    single_frame=True,  # tfds.features.Image decodes with expand_animations=True
)
# The keys of object_detection/core/standard_fields.py TfExampleFields that exist
# without boxes; ODAPI label maps start at id 1 (0 is the background).
ODAPI = Schema(
    "odapi",
    {
        **{role: key for role, key in SLIM.roles.items() if role not in ("channels", "colorspace", "sha256")},
        "source_id": "image/source_id",
        "sha256": SHA256_KEY,
    },
    multi_label=True,
    label_offset=1,
    raw_ok=False,
    single_frame=True,  # tf-slim's decoder falls back to decode_image for GIF and WebP
)

PRESETS: dict[str, Schema] = {s.name: s for s in (SLIM, TUTORIAL, TFDS, ODAPI)}
DEFAULT_SCHEMA = SLIM.name


def get_schema(name: str, renames: tuple[tuple[str, str], ...] | dict[str, str] = ()) -> Schema:
    """The preset called `name`, with custom key renames applied.

    Raises:
      ValueError: unknown preset (the message names the choices) or bad renames.
    """
    try:
        schema = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown schema {name!r} (one of {', '.join(sorted(PRESETS))})") from None
    return schema.renamed(tuple(renames.items() if isinstance(renames, dict) else renames))


def schema_from_summary(summary: dict) -> Schema:
    """The schema a dataset was written with, from its summary.json document."""
    return get_schema(summary.get("schema", DEFAULT_SCHEMA), summary.get("rename_keys") or {})
