"""Reading a converted dataset back: `load_dataset` and `parse_spec`.

    ds = load_dataset("out", "train", image_size=(224, 224), batch_size=32)

summary.json says how records are parsed and decoded (schema, key renames, store mode, class
names, label offset), so callers never repeat the feature keys. Paths may be local or `gs://`
(tf.io.gfile, not Beam's filesystems: no Beam import). TensorFlow is imported when called.

The label: a scalar (`FixedLenFeature([], tf.int64)`, its text a scalar string) when the
summary says every record has exactly one (`labels_per_record`, transforms/output/summary.py),
so `int(ex["image/class/label"])` works; a `VarLenFeature` (sparse) for multi-label data.
"""

from __future__ import annotations

import json
import posixpath

from transforms.encoding.dataset_format import DatasetFormat
from transforms.encoding.schema import DEFAULT_SCHEMA, Schema, get_schema
from transforms.images.decoding import decode_stored
from transforms.output.publish import SUMMARY_FILE
from transforms.output.tfds import is_single_label

SHARD_GLOB = "{split}-*-of-*.tfrecord*"
SHARD_SUFFIXES = (".tfrecord", ".tfrecord.gz")  # not the .idx files next to them


def _join(root: str, name: str) -> str:
    return posixpath.join(root, name) if "://" in root else f"{root.rstrip('/')}/{name}"


def read_summary(output_dir: str) -> dict:
    """summary.json of a finished dataset.

    Raises:
      FileNotFoundError: no summary.json (not a dataset, or the conversion did not finish).
    """
    import tensorflow as tf

    path = _join(output_dir, SUMMARY_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found: not a finished img2tfrecord dataset")
    with tf.io.gfile.GFile(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def dataset_spec(schema: Schema, summary: dict) -> dict:
    """The parse spec of a dataset's records: the schema's, with the label (and its text) as
    scalars when every record has exactly one label."""
    spec = schema.parse_spec()
    if not is_single_label(summary):
        return spec
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "bytes": tf.string}
    for key in (schema.label_key, schema.roles.get("text")):
        if key in spec and key not in schema.scalar:
            spec[key] = tf.io.FixedLenFeature([], dtypes[schema.kinds[key]])
    return spec


def parse_spec(output_dir_or_schema: str | Schema = DEFAULT_SCHEMA) -> dict:
    """The `tf.io.parse_single_example` spec of a dataset folder or a schema name/preset.

    A string naming a folder with summary.json gives that dataset's spec (the label a scalar
    when every record has one: `dataset_spec`); any other string is taken as a schema name,
    whose list keys stay `VarLenFeature`s.
    """
    if isinstance(output_dir_or_schema, Schema):
        return output_dir_or_schema.parse_spec()
    try:
        schema = get_schema(output_dir_or_schema)
    except ValueError:
        summary = read_summary(output_dir_or_schema)
        return dataset_spec(DatasetFormat.from_summary(summary).schema, summary)
    return schema.parse_spec()


def load_dataset(
    output_dir: str,
    split: str = "train",
    *,
    image_size: tuple[int, int] | None = None,
    channels: int = 3,
    batch_size: int | None = None,
    shuffle_files: bool = False,
    shuffle_buffer: int = 0,
    cycle_length: int = 8,
    seed: int | None = None,
):
    """A `tf.data.Dataset` of (image, label) from a converted dataset.

    Shards are read in parallel (`interleave`, `cycle_length` at a time). Each image is
    decoded as stored (`tf.io.decode_image(expand_animations=False)`; raw pixels of
    `--store raw` reshaped by their stored height, width and channels) and converted to
    `channels` (transforms.images.decoding.to_channels: alpha dropped or made opaque, grey repeated
    to RGB, RGB to grey), as uint8 (H, W, channels), or resized to `image_size` (float32,
    0-255). Labels are int64 ids for single-label data, and multi-hot float32 vectors of
    length `label_offset + num_classes` otherwise. A dataset of objects (summary.json
    "objects": boxes, masks, class maps) gives (image, objects) instead: `objects_of`.

    Args:
      output_dir: the conversion's --output_dir (local or gs://).
      split: split name, e.g. 'train'.
      image_size: (height, width) to resize to; None keeps each image's size.
      channels: channels of the decoded images (1, 3 or 4; 0 keeps the stored ones).
      batch_size: batch the output (needs `image_size` unless every image has one size).
      shuffle_files: read the shards in a random order.
      shuffle_buffer: shuffle records through a buffer of this many (0: no shuffle).
      cycle_length: shards read at once.
      seed: seed of the shuffles.

    Raises:
      FileNotFoundError: no summary.json, or no shards for `split`.
    """
    import tensorflow as tf

    summary = read_summary(output_dir)
    fmt = DatasetFormat.from_summary(summary)
    schema = fmt.schema
    found = tf.io.gfile.glob(_join(output_dir, SHARD_GLOB.format(split=split)))
    shards = sorted(p for p in found if p.endswith(SHARD_SUFFIXES))
    if not shards:
        known = ", ".join(sorted(summary.get("splits", {}))) or "none"
        raise FileNotFoundError(f"no shards for split {split!r} in {output_dir} (splits: {known})")
    compression = "GZIP" if shards[0].endswith(".gz") else ""
    spec = dataset_spec(schema, summary)
    depth = summary.get("label_offset", 0) + summary.get("num_classes", 0)
    label_scalar = isinstance(spec[schema.label_key], tf.io.FixedLenFeature)

    def decode(serialized):
        ex = tf.io.parse_single_example(serialized, spec)
        shape = [ex[k] for k in fmt.shape_keys()] if fmt.raw else None
        image = decode_stored(ex[schema.image_key], fmt.store, shape, channels)
        if schema.object_roles:
            objects = objects_of(ex, schema, tf.shape(image)[0], tf.shape(image)[1])
            return (tf.image.resize(image, image_size) if image_size is not None else image), objects
        if image_size is not None:
            image = tf.image.resize(image, image_size)
        labels = ex[schema.label_key]
        if label_scalar:
            label = labels
        else:
            label = tf.minimum(tf.reduce_sum(tf.one_hot(labels.values, depth), axis=0), 1.0)
        return image, label

    files = tf.data.Dataset.from_tensor_slices(shards)
    if shuffle_files:
        files = files.shuffle(len(shards), seed=seed)
    ds = files.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=min(cycle_length, len(shards)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not (shuffle_files or shuffle_buffer),
    )
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size and schema.object_roles:
        ds = ds.ragged_batch(batch_size)
    elif batch_size:
        ds = ds.batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE)


def objects_of(ex: dict, schema: Schema, height, width) -> dict:
    """One parsed record's objects as dense tensors, one row per object: `boxes` float32 (n, 4)
    [ymin, xmin, ymax, xmax] as fractions (tf.image's and the Model Garden's order), `classes`
    int64 (n,), `is_crowd` bool (n,), `area` float32 (n,), and when written `masks` uint8
    (n, H, W) of 0/1 and `class_map` uint8 (H, W) of class ids (255: ignore)."""
    import tensorflow as tf

    roles = schema.object_roles

    def dense(role, default=0):
        return tf.sparse.to_dense(ex[roles[role]], default_value=default)

    if "boxes" in roles:  # TFDS's objects/bbox: [ymin, xmin, ymax, xmax] flattened
        boxes = tf.reshape(dense("boxes"), [-1, 4])
    else:
        boxes = tf.stack([dense("ymin"), dense("xmin"), dense("ymax"), dense("xmax")], axis=1)
    objects = {
        "boxes": boxes,
        "classes": dense("label"),
        "is_crowd": tf.cast(dense("is_crowd"), tf.bool),
        "area": tf.cast(dense("area"), tf.float32),
    }
    if "masks" in roles:
        pngs = tf.sparse.to_dense(ex[roles["masks"]], default_value="")
        objects["masks"] = tf.cond(  # as the Model Garden's decoder: none without objects
            tf.size(pngs) > 0,
            lambda: tf.map_fn(
                lambda png: tf.io.decode_png(png, channels=1)[..., 0],
                pngs,
                fn_output_signature=tf.TensorSpec([None, None], tf.uint8),
            ),
            lambda: tf.zeros(tf.stack([0, height, width]), tf.uint8),
        )
    if "class_map" in roles:
        png = tf.sparse.to_dense(ex[roles["class_map"]], default_value="")  # none, or one PNG
        objects["class_map"] = tf.cond(
            tf.size(png) > 0,
            lambda: tf.io.decode_png(png[0], channels=1)[..., 0],
            lambda: tf.fill(tf.stack([height, width]), tf.constant(255, tf.uint8)),  # no map: all ignore
        )
    return objects
