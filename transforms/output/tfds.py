"""Metadata next to the shards so that existing readers load them without glue code.

- TFDS: `dataset_info.json` (split shard lengths, a `<split>-SSSSS-of-NNNNN` template),
  `features.json` (from the schema, nested at '/' as TFDS flattens feature names into
  Example keys) and `<feature>.labels.txt`: what `tfds.builder_from_directory` reads.
- ODAPI: `label_map.pbtxt` (`item { id: 1 name: "cat" }`).

Pure functions build the documents (TFDS is not a runtime dependency).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence

from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.batching import chunked
from transforms.encoding.schema import Schema
from transforms.images.decoding import (
    BYTES_FEATURE,
    IMAGE_FEATURE,
    STORE_ENCODED,
    image_feature_kind,
)
from transforms.output.summary import single_label
from transforms.records import ClassIndex
from transforms.writing.files import write_text

DATASET_INFO_FILE = "dataset_info.json"
FEATURES_FILE = "features.json"
LABEL_MAP_FILE = "label_map.pbtxt"
TFDS_VERSION = "1.0.0"
# `{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}` -> train-00000-of-00003.tfrecord
TFDS_FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"
# Keys under this prefix hold one value per object (boxes), never one per image.
PER_OBJECT_PREFIX = "image/object/"
# Name given to ids below --label_offset (id 0 is "background" for ODAPI-style data).
_BACKGROUND = "background"

_FEATURES = "tensorflow_datasets.core.features."
_DTYPES = {"int64": "int64", "float": "float32", "bytes": "string"}


def _feature(cls: str, **body) -> dict:
    return {"pythonClassName": _FEATURES + cls, **body}


def _tensor(kind: str, scalar: bool) -> dict:
    if kind == "bytes":
        text = _feature("text_feature.Text", text={})
        return text if scalar else _sequence(text)
    shape = {"dimensions": [] if scalar else ["-1"]}
    return _feature(
        "tensor_feature.Tensor", tensor={"shape": shape, "dtype": _DTYPES[kind], "encoding": "none"}
    )


def _sequence(feature: dict) -> dict:
    return _feature("sequence_feature.Sequence", sequence={"feature": feature, "length": "-1"})


def _image_feature(kind: str) -> dict:
    if kind == IMAGE_FEATURE:  # decoded by TFDS with tf.image.decode_image(channels=3): RGB
        return _feature(
            "image_feature.Image", image={"shape": {"dimensions": ["-1", "-1", "3"]}, "dtype": "uint8"}
        )
    if kind == BYTES_FEATURE:
        return _tensor("bytes", True)
    # RAW_FEATURE: one bytes value, decoded by TFDS with tf.io.decode_raw to a flat uint8 vector.
    shape = {"dimensions": ["-1"]}
    return _feature("tensor_feature.Tensor", tensor={"shape": shape, "dtype": "uint8", "encoding": "bytes"})


def _object_feature(kind: str, num_labels: int) -> dict:
    """The TFDS feature of one object's value (schema.ObjectKeys' TFDS kinds), as TFDS's coco and
    voc builders declare them: a BBoxFeature [ymin, xmin, ymax, xmax], a ClassLabel, bool flags."""
    if kind == "bbox":
        return _feature(
            "bounding_boxes.BBoxFeature",
            boundingBox={"shape": {"dimensions": ["4"]}, "dtype": "float32", "bboxFormat": "REL_YXYX"},
        )
    if kind == "label":
        return _feature("class_label_feature.ClassLabel", classLabel={"numClasses": str(num_labels)})
    if kind == "png":  # a class map: one channel of class ids
        shape = {"dimensions": ["-1", "-1", "1"]}
        return _feature(
            "image_feature.Image", image={"shape": shape, "dtype": "uint8", "encodingFormat": "png"}
        )
    dtype = {"bool": "bool", "int64": "int64", "float": "float32"}.get(kind)
    if dtype is None:
        return _feature("text_feature.Text", text={})
    return _feature("tensor_feature.Tensor", tensor={"shape": {}, "dtype": dtype, "encoding": "none"})


# Object keys under this node are one TFDS Sequence of per-object features (the tfds preset).
_OBJECTS_SEQUENCE = "objects"


def _features_dict(features: dict) -> dict:
    return _feature("features_dict.FeaturesDict", featuresDict={"features": features})


def class_label_names(class_names: Sequence[str], offset: int) -> list[str]:
    """ClassLabel names by id: ids below `offset` get a placeholder name (unique: one that is a
    class name is skipped), in time linear in `offset` plus the class count."""
    taken = set(class_names)
    names = (_BACKGROUND if n == 0 else f"{_BACKGROUND}_{n}" for n in itertools.count())
    return list(itertools.islice((name for name in names if name not in taken), offset)) + list(class_names)


def is_single_label(summary: dict) -> bool:
    """True when every record has exactly one label: summary.json's `labels_per_record`, or, for a
    dataset written before it, its per-class keys all being class names (summary.json then held them)."""
    single = single_label(summary)
    if single is not None:
        return single
    names = set(summary.get("class_names", []))
    return bool(names) and all(key in names for key in summary.get("written_per_class", {}))


def features_json(schema: Schema, num_labels: int, single_label: bool, image: str = IMAGE_FEATURE) -> dict:
    """The TFDS `features.json` document for records written with `schema`.

    The image becomes what `image` says (images.decoding.image_feature_kind): an `Image`
    (decoded to RGB), the encoded bytes as `Text`, or raw pixels as a flat uint8 `Tensor`;
    the label a `ClassLabel` (a `Sequence` of them for multi-label data and per-object
    labels), other bytes `Text`, numbers `Tensor`.

    Raises:
      ValueError: a key clashes with a group of nested keys.
    """
    root: dict = {}
    for key, kind in sorted(schema.kinds.items()):
        scalar = key in schema.scalar
        object_kind = schema.object_kinds.get(key)
        if key == schema.image_key:
            feature = _image_feature(image)
        elif object_kind is not None and key.startswith(_OBJECTS_SEQUENCE + "/"):
            feature = _object_feature(object_kind, num_labels)  # one object's: in the sequence below
        elif object_kind == "png":
            feature = _object_feature(object_kind, num_labels)
        elif key == schema.label_key:
            label = _feature("class_label_feature.ClassLabel", classLabel={"numClasses": str(num_labels)})
            one = single_label and (scalar or not key.startswith(PER_OBJECT_PREFIX))
            feature = label if one else _sequence(label)
        else:
            feature = _tensor(kind, scalar)
        *parents, leaf = key.split("/")
        prefixes = {"/".join(parents[: i + 1]) for i in range(len(parents))}
        if prefixes & set(schema.kinds):
            # A key under another feature ('image' and 'image/filename', as the tfds
            # preset has): TFDS takes it as one flat key, which serializes the same.
            parents, leaf = [], key
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        if leaf in node:
            raise ValueError(f"feature {key!r} is also a prefix of another feature")
        node[leaf] = feature

    def wrap(node: dict, top: bool = False) -> dict:
        out = {k: v if "pythonClassName" in v else _features_dict(wrap(v)) for k, v in node.items()}
        if top and schema.object_kinds and _OBJECTS_SEQUENCE in out:  # TFDS's `objects` Sequence
            out[_OBJECTS_SEQUENCE] = _sequence(out[_OBJECTS_SEQUENCE])
        return out

    return _features_dict(wrap(root, top=True))


def tfds_name(output_dir: str) -> str:
    """A TFDS dataset name (snake_case) from the output folder's name."""
    base = output_dir.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_")
    return name if name and name[0].isalpha() else f"img2tfrecord_{name}".rstrip("_")


def label_map_pbtxt(class_names: Sequence[str], offset: int) -> Iterator[str]:
    """An Object Detection API label map: one `item { id name }` per class, a class at a time."""
    for i, name in enumerate(class_names):
        q = json.dumps(name, ensure_ascii=False)  # a text-format literal
        yield f"item {{\n  id: {i + offset}\n  name: {q}\n  display_name: {q}\n}}\n"


def write_lines(path: str, lines: Iterable[str]) -> None:
    """Streams `lines` (each ending in its line break) into `path` as UTF-8, thousands a write."""
    with gcs.create(path, mime_type="text/plain") as out:
        for chunk in chunked(lines, 10_000):
            out.write("".join(chunk).encode("utf-8"))


def write_reader_metadata(
    output_dir: str,
    summary: dict,
    schema: Schema,
    split_shards: dict[str, list[int]],
    compression: str,
    image_formats: set[str] | frozenset[str] = frozenset(),
    name: str | None = None,
    *,
    class_index: ClassIndex,
    labels_file: str,
) -> list[str]:
    """Writes the reader metadata files into `output_dir` (or a staging folder); returns their names.

    TFDS reads uncompressed TFRecords only, so gzip output gets no TFDS files. The image
    feature follows the store mode and the stored `image_formats`: an `Image` only when TFDS
    decodes every stored format to 3-D. `name`: the TFDS name (default: from `output_dir`).
    The class names come from `class_index`; `labels_file` is labels.txt, already written: the
    TFDS names file is a copy of it by the store (FileSystems.copy) when no id is below the
    offset, else it is streamed with the placeholders first. Nothing holds the names as one text.
    """
    names, offset = class_index.names, class_index.offset
    written: list[str] = []
    if schema.name == "odapi":
        write_lines(FileSystems.join(output_dir, LABEL_MAP_FILE), label_map_pbtxt(names, offset))
        written.append(LABEL_MAP_FILE)
    if compression != "none" or not split_shards:
        return written
    image = image_feature_kind(summary.get("store", STORE_ENCODED), frozenset(image_formats))
    features = features_json(schema, offset + len(names), is_single_label(summary), image=image)
    label_file = schema.label_key.replace("/", "-") + ".labels.txt"  # where TFDS looks for the names
    if offset:
        placeholders = class_label_names(names, offset)[:offset]  # (set of the names: linear in them)
        write_lines(FileSystems.join(output_dir, label_file), (n + "\n" for n in (*placeholders, *names)))
    else:
        FileSystems.copy([labels_file], [FileSystems.join(output_dir, label_file)])
    write_text(FileSystems.join(output_dir, FEATURES_FILE), json.dumps(features, indent=2) + "\n")
    splits = summary.get("splits", {})
    info = {  # the DatasetInfo proto as JSON
        "name": name or tfds_name(output_dir),
        "description": "Images converted to TFRecord by img2tfrecord.",
        "version": TFDS_VERSION,
        "fileFormat": "tfrecord",
        "moduleName": "img2tfrecord",
        "splits": [
            {
                "name": split,
                "numBytes": str(splits.get(split, {}).get("bytes", 0)),
                "shardLengths": [str(n) for n in lengths],
                "filepathTemplate": TFDS_FILEPATH_TEMPLATE,
            }
            for split, lengths in sorted(split_shards.items())
        ],
    }
    write_text(FileSystems.join(output_dir, DATASET_INFO_FILE), json.dumps(info, indent=2) + "\n")
    return written + [label_file, FEATURES_FILE, DATASET_INFO_FILE]
