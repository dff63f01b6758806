"""Schema presets: a preset turns (record, stored bytes, image info, class index) into a feature
dict, and gives the matching `tf.io.parse_single_example` spec so readers never guess the keys:

- `slim` (default): TF-slim / inception keys `image/encoded`, `image/class/label`, ...
- `tutorial`: the TensorFlow TFRecord tutorial's `height, width, depth, label, image_raw`.
- `tfds`: `image`, `label`, `image/filename`, as TFDS `Image`, `ClassLabel` and `Text`.
- `odapi`: the TF Object Detection API's keys with image-level `image/class/*`, ids from 1.

Every preset also carries `image/key/sha256` (hex SHA-256 of the stored image bytes).
`get_schema(name, renames)` applies custom key renames (`--rename_keys old=new,...`).

Records that carry objects (boxes, masks, a class map: encoding/objects.py) add the object keys of
`odapi` (the OD API / Model Garden `image/object/*`) or `tfds` (TFDS's `objects` sequence):
`Schema.with_objects`. A dataset without objects never has them, in its records or its spec.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from transforms.encoding.objects import PreparedObjects
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
      objects: how the preset writes objects (ObjectKeys), or None: it cannot.
      object_roles: on a schema `with_objects`, the object keys it holds (role -> key: boxes,
        label, text, area, is_crowd, ...); TFDS feature kinds in `object_kinds` (key -> kind).
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
    objects: ObjectKeys | None = None
    object_roles: dict[str, str] = dataclasses.field(default_factory=dict)
    object_kinds: dict[str, str] = dataclasses.field(default_factory=dict)

    def with_objects(self, masks: bool = False, class_map: bool = False) -> Schema:
        """This preset with its object keys (masks and class map keys when asked). Raises
        ValueError: the preset has no object keys."""
        keys = self.objects
        if keys is None:
            raise ValueError(
                f"the {self.name} schema has no object keys (--schema odapi or tfds writes boxes)"
            )
        chosen = {
            role: entry
            for role, entry in keys.keys.items()
            if (masks or role != "masks") and (class_map or role not in ("class_map", "class_map_format"))
        }
        kinds = {k: v for k, v in self.kinds.items() if k not in keys.drops}
        kinds.update({key: kind for key, kind, _ in chosen.values()})
        scalar = self.scalar - set(keys.drops)  # the class map too: not every record has one
        return dataclasses.replace(
            self,
            kinds=kinds,
            scalar=frozenset(scalar),
            label_key=chosen["label"][0],
            roles={r: k for r, k in self.roles.items() if k not in keys.drops},
            object_roles={role: key for role, (key, _, _) in chosen.items()},
            object_kinds={key: tfds for key, _, tfds in chosen.values()},
        )

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

    def features(
        self,
        record: ImageRecord,
        data: bytes,
        info: ImageInfo,
        class_index: ClassIndex,
        objects: PreparedObjects | None = None,
    ) -> dict:
        """The feature dict of one image: the preset's keys (and its object keys when `objects`
        is given: call on the schema `with_objects`), the content hash and the record's extra
        features, with the custom renames applied."""
        if objects is None:
            features = {
                **self.build(record, data, info, class_index),
                SHA256_KEY: content_key(data),
                **dict(record.extras),
            }
        else:
            features = {
                **self.build(record, data, info, class_index, objects=True),
                **self.objects.build(objects),
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
            object_roles={r: rename(k) for r, k in self.object_roles.items()},
            object_kinds={rename(k): v for k, v in self.object_kinds.items()},
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


@dataclasses.dataclass(frozen=True)
class ObjectKeys:
    """How a preset writes an image's objects.

    keys: role -> (key, Example kind, TFDS feature kind: 'bbox', 'label', 'bool', 'int64',
      'float', 'text', 'png'); build: PreparedObjects -> their features; drops: image-level keys
      a record with objects does not write (TFDS detection data has no image label).
    """

    keys: dict[str, tuple[str, str, str]]
    build: Callable[[PreparedObjects], dict]
    drops: tuple[str, ...] = ()


def _flags(values) -> list[int]:
    return [int(v) for v in values.tolist()]


def _odapi_objects(o: PreparedObjects) -> dict:
    """The OD API / Model Garden object keys (object_detection/core/standard_fields.py TfExampleFields)."""
    xmin, ymin, xmax, ymax = (column.tolist() for column in o.boxes.T)
    features = {
        "image/object/bbox/xmin": xmin,
        "image/object/bbox/ymin": ymin,
        "image/object/bbox/xmax": xmax,
        "image/object/bbox/ymax": ymax,
        "image/object/class/label": list(o.ids),
        "image/object/class/text": list(o.labels),
        "image/object/area": o.area.tolist(),
        "image/object/is_crowd": _flags(o.is_crowd),
        "image/object/difficult": _flags(o.difficult),
        "image/object/truncated": _flags(o.truncated),
    }
    if o.masks is not None:
        features["image/object/mask"] = list(o.masks)
    if o.class_map is not None:
        features["image/segmentation/class/encoded"] = o.class_map
        features["image/segmentation/class/format"] = "png"
    return features


_ODAPI_OBJECTS = ObjectKeys(
    {
        "xmin": ("image/object/bbox/xmin", "float", "float"),
        "ymin": ("image/object/bbox/ymin", "float", "float"),
        "xmax": ("image/object/bbox/xmax", "float", "float"),
        "ymax": ("image/object/bbox/ymax", "float", "float"),
        "label": ("image/object/class/label", "int64", "label"),
        "text": ("image/object/class/text", "bytes", "text"),
        "area": ("image/object/area", "float", "float"),
        "is_crowd": ("image/object/is_crowd", "int64", "int64"),
        "difficult": ("image/object/difficult", "int64", "int64"),
        "truncated": ("image/object/truncated", "int64", "int64"),
        "masks": ("image/object/mask", "bytes", "text"),
        "class_map": ("image/segmentation/class/encoded", "bytes", "text"),
        "class_map_format": ("image/segmentation/class/format", "bytes", "text"),
    },
    _odapi_objects,
)


def _tfds_objects(o: PreparedObjects) -> dict:
    """TFDS's `objects` sequence (as its coco and voc builders have it): bbox is a BBoxFeature
    [ymin, xmin, ymax, xmax], label a ClassLabel (ids from 0), flags bool, area int64."""
    features = {
        "objects/bbox": o.boxes[:, [1, 0, 3, 2]].reshape(-1).tolist(),
        "objects/label": list(o.ids),
        "objects/is_crowd": _flags(o.is_crowd),
        "objects/is_difficult": _flags(o.difficult),
        "objects/is_truncated": _flags(o.truncated),
        "objects/area": [round(a) for a in o.area.tolist()],
    }
    if o.class_map is not None:
        features["segmentation_mask"] = o.class_map
    return features


_TFDS_OBJECTS = ObjectKeys(
    {
        "boxes": ("objects/bbox", "float", "bbox"),
        "label": ("objects/label", "int64", "label"),
        "is_crowd": ("objects/is_crowd", "int64", "bool"),
        "difficult": ("objects/is_difficult", "int64", "bool"),
        "truncated": ("objects/is_truncated", "int64", "bool"),
        "area": ("objects/area", "int64", "int64"),
        "class_map": ("segmentation_mask", "bytes", "png"),
    },
    _tfds_objects,
    drops=("label",),
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


def _tfds(
    record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex, objects: bool = False
) -> dict:
    features = {"image": data, "image/filename": source_name(record.path, record.relpath)}
    if not objects:  # detection data has per-object labels only, as TFDS's coco and voc
        features["label"] = single_label_id(record, class_index, "tfds")
    return features


# TFDS's ImageFolder features: `image` (tfds.features.Image), `label` (ClassLabel, ids
# from 0) and `image/filename` (Text). TFDS parses only the keys it declares.
TFDS = preset(
    "tfds",
    _tfds,
    {"image": ("image", "bytes"), "label": ("label", "int64"), "filename": ("image/filename", "bytes")},
    label_offset=0,
    raw_ok=False,
    single_frame=True,  # tfds.features.Image decodes with expand_animations=True
    objects=_TFDS_OBJECTS,
)


def _odapi(
    record: ImageRecord, data: bytes, info: ImageInfo, class_index: ClassIndex, objects: bool = False
) -> dict:
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
    objects=_ODAPI_OBJECTS,
)

PRESETS: dict[str, Schema] = {s.name: s for s in (SLIM, TUTORIAL, TFDS, ODAPI)}
DEFAULT_SCHEMA = SLIM.name


def get_schema(
    name: str,
    renames: tuple[tuple[str, str], ...] | dict[str, str] = (),
    objects: tuple[bool, bool] | None = None,
) -> Schema:
    """The preset called `name` (`with_objects(*objects)` when `objects` is (masks, class_map)),
    with custom key renames applied.
    Raises ValueError: unknown preset (the message names the choices), bad renames, or objects
    asked of a preset without object keys."""
    if name not in PRESETS:
        raise ValueError(f"unknown schema {name!r} (one of {', '.join(sorted(PRESETS))})")
    schema = PRESETS[name] if objects is None else PRESETS[name].with_objects(*objects)
    return schema.renamed(tuple(dict(renames).items()))


def schema_from_summary(summary: dict) -> Schema:
    """The schema a dataset was written with, from its summary.json document (with its object
    keys when it holds objects: summary.json's "objects" section)."""
    objects = summary_objects(summary)
    return get_schema(summary.get("schema", DEFAULT_SCHEMA), summary.get("rename_keys") or {}, objects)


def summary_objects(summary: dict) -> tuple[bool, bool] | None:
    """(masks, class maps) when summary.json says the records hold objects ("objects"), else None."""
    section = summary.get("objects")
    return None if section is None else (bool(section.get("masks")), bool(section.get("class_maps")))
