"""Shared fixtures: real images written with Pillow, and reading TFRecords back with TensorFlow."""

from __future__ import annotations

import collections
import glob
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The test processes run Beam pipelines (gRPC started) and then start CLIs with `subprocess`:
# gRPC's fork handlers off, as the CLI has them, before anything imports gRPC (why:
# beam_pipeline/__init__.py `without_grpc_fork_handlers`; importing it would import gRPC).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


# Files next to the shards of every finished (uncompressed, slim) dataset.
METADATA_FILES = [
    "dataset_info.json",
    "failures.jsonl",
    "features.json",
    "image-class-label.labels.txt",
    "labels.txt",
    "summary.json",
]


def frame_record(data: bytes) -> bytes:
    """`data` framed as one TFRecord (what the writer appends for an uncompressed shard)."""
    from transforms.encoding.tfrecord import frame_chunks

    header, footer = frame_chunks((data,), len(data))
    return header + data + footer


def write_image(path: Path, size=(24, 16), mode: str = "RGB", fmt: str | None = None, seed: int = 0) -> Path:
    """Writes a random image of `size` (w, h) and `mode` to `path` (format from `fmt` or suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    if mode in ("1", "L", "P"):
        img = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L").convert(mode)
    elif mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16), "I;16")
    else:
        bands = len(mode)
        img = Image.fromarray(rng.integers(0, 256, (h, w, bands), dtype=np.uint8), mode if bands > 1 else "L")
    img.save(path, format=fmt)
    return path


def read_records(output_dir: Path | str, split: str = "train") -> list[dict]:
    """Every Example of a split's shards, parsed with TensorFlow's own ops and decoded."""
    import tensorflow as tf

    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.VarLenFeature(tf.int64),
        "image/class/text": tf.io.VarLenFeature(tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/channels": tf.io.FixedLenFeature([], tf.int64),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
    }
    shards = sorted(glob.glob(os.path.join(str(output_dir), f"{split}-*-of-*.tfrecord*")))
    shards = [s for s in shards if not s.endswith(".idx")]
    compression = "GZIP" if shards and shards[0].endswith(".gz") else ""
    out = []
    for raw in tf.data.TFRecordDataset(shards, compression_type=compression):
        ex = tf.io.parse_single_example(raw, spec)
        image = tf.io.decode_image(ex["image/encoded"], expand_animations=False)
        out.append(
            {
                "filename": ex["image/filename"].numpy().decode("utf-8"),
                "format": ex["image/format"].numpy().decode(),
                "label": tf.sparse.to_dense(ex["image/class/label"]).numpy().tolist(),
                "text": [t.decode("utf-8") for t in tf.sparse.to_dense(ex["image/class/text"]).numpy()],
                "height": int(ex["image/height"]),
                "width": int(ex["image/width"]),
                "channels": int(ex["image/channels"]),
                "decoded_shape": tuple(image.shape),
                "encoded": ex["image/encoded"].numpy(),
            }
        )
    return out


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """A small labelled folder: three classes (one Korean, one with a space), nested folders."""
    root = tmp_path / "images"
    write_image(root / "cat" / "a.jpg", (32, 20), seed=1)
    write_image(root / "cat" / "deep" / "er" / "b.JPEG", (20, 32), seed=2, fmt="JPEG")
    write_image(root / "dog house" / "c.png", (16, 16), "RGBA", seed=3)
    write_image(root / "dog house" / "d.PNG", (8, 12), "L", seed=4)
    write_image(root / "서울광장" / "e.gif", (10, 10), "P", seed=5)
    write_image(root / "서울광장" / "f.bmp", (12, 9), "RGB", seed=6)
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def gcs_bucket(tmp_path_factory):
    """A bucket on a local GCS emulator (tests/gcs_emulator.py), one server per test module.

    While the module runs, os.environ points Google's clients (and so Beam's gs:// filesystem,
    in this process and in the workers it starts) at the emulator.
    """
    from tests.gcs_emulator import BUCKET, start_emulator

    emulator = start_emulator(tmp_path_factory.mktemp("gcs"), [BUCKET])
    saved = {k: os.environ.get(k) for k in emulator.env}
    os.environ.update(emulator.env)
    from google.cloud import storage

    try:
        yield storage.Client().bucket(BUCKET)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        emulator.stop()


def tf_shape(data: bytes) -> tuple | None:
    """What `tf.io.decode_image(data, expand_animations=False)` gives: its shape, or None if it refuses."""
    import tensorflow as tf

    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except tf.errors.InvalidArgumentError:
        return None


def check_fuzzed(variants, decode) -> collections.Counter:
    """Runs the writer's check on each fuzzed file: rejected, or kept/converted to bytes that
    `decode` (bytes -> shape, TensorFlow's) reads at exactly the checked shape. Returns the
    verdict counts (rejected, kept, converted)."""
    from transforms.encoding.encoder import check_image
    from transforms.images.types import ImageError

    verdicts = collections.Counter()
    for data in variants:
        try:
            prepared = check_image(data)
        except ImageError:
            verdicts["rejected"] += 1
            continue
        verdicts["kept" if prepared.data == data else "converted"] += 1
        info = prepared.info
        assert decode(prepared.data) == (info.height, info.width, info.channels), (
            prepared.converted,
            data.hex(),
        )
    return verdicts


def chromium_screenshot(page: Path, shot: Path, width: int, height: int) -> None:
    """Renders the local HTML file `page` in headless Chromium into the PNG `shot`."""
    import subprocess

    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            f"--window-size={width},{height}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
