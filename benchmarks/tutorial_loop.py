"""Baseline: the TensorFlow tutorial's conversion loop, one process, one writer.

As in the TFRecord tutorial (tensorflow.org/tutorials/load_data/tfrecord): read each file,
`tf.image.decode_jpeg` it for the shape, build a `tf.train.Example` with the same features as
img2tfrecord's `slim` preset, and write it with one `tf.io.TFRecordWriter`. No shuffle, no
sharding, no failure handling.

    python benchmarks/tutorial_loop.py <input_dir> <output_file>
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def main(input_dir: str, output_file: str) -> int:
    classes = sorted(d for d in os.listdir(input_dir) if os.path.isdir(os.path.join(input_dir, d)))
    count = 0
    with tf.io.TFRecordWriter(output_file) as writer:
        for label, name in enumerate(classes):
            folder = os.path.join(input_dir, name)
            for filename in sorted(os.listdir(folder)):
                image_string = open(os.path.join(folder, filename), "rb").read()
                shape = tf.image.decode_jpeg(image_string).shape
                feature = {
                    "image/encoded": _bytes(image_string),
                    "image/format": _bytes(b"jpeg"),
                    "image/class/label": _int64(label),
                    "image/class/text": _bytes(name.encode()),
                    "image/height": _int64(shape[0]),
                    "image/width": _int64(shape[1]),
                    "image/channels": _int64(shape[2]),
                    "image/colorspace": _bytes(b"RGB"),
                    "image/filename": _bytes(f"{name}/{filename}".encode()),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
                count += 1
    print(f"tutorial loop: wrote {count} images", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
