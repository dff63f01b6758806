"""Reader metadata for multi-label data, label offsets and per-object presets (no pipeline run).

A small multi-label dataset is written directly (encode_image + TFRecord framing), with the
metadata files FinalizeFn writes, and read back with TFDS, load_dataset and verify.
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
from PIL import Image

from beam_pipeline import load_dataset
from beam_pipeline.readers.verify import verify
from tests.conftest import frame_record
from transforms.encoding.encoder import encode_image_chunks
from transforms.encoding.schema import SLIM, Schema
from transforms.output.failure_log import FailureCounts
from transforms.output.summary import build_summary
from transforms.output.tfds import (
    class_label_names,
    features_json,
    label_map_pbtxt,
    tfds_name,
    write_reader_metadata,
)
from transforms.records import ClassIndex, ImageRecord


def encode_image(*args):
    chunks, info = encode_image_chunks(*args)
    return b"".join(chunks), info


def _png(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_multi_label_dataset_with_offset_loads_in_tfds_load_dataset_and_verify(tmp_path):
    import tensorflow_datasets as tfds

    index = ClassIndex(("a", "b"), offset=1)
    labels = [("a",), ("a", "b"), (), ("b",)]
    records = [ImageRecord(f"/x/{i}.png", f"{i}.png", 1, labels=ls) for i, ls in enumerate(labels)]
    serialized = [encode_image(r, _png(5 + i, 4, i), index)[0] for i, r in enumerate(records)]
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"".join(frame_record(s) for s in serialized))
    written = {("train", r.class_key): 1 for r in records}
    summary = build_summary(4, written, written, FailureCounts(), [], index)
    summary["splits"]["train"].update(shards=1, bytes=sum(map(len, serialized)))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "labels.txt").write_text("a\nb\n")
    write_reader_metadata(
        str(tmp_path),
        summary,
        SLIM,
        {"train": [4]},
        "none",
        class_index=index,
        labels_file=str(tmp_path / "labels.txt"),
    )

    builder = tfds.builder_from_directory(str(tmp_path))
    label = builder.info.features["image"]["class"]["label"]
    assert label.feature.names == ["background", "a", "b"]
    got = [ex["image"]["class"]["label"].numpy().tolist() for ex in builder.as_dataset(split="train")]
    assert got == [[1], [1, 2], [], [2]]

    hots = sorted(tuple(hot.numpy().tolist()) for _, hot in load_dataset(str(tmp_path)))
    assert hots == sorted([(0, 1, 0), (0, 1, 1), (0, 0, 0), (0, 0, 1)])

    checks, problems = verify(str(tmp_path), decode_all=True)
    assert problems == [] and checks[0].records == 4 and checks[0].decoded == 4
    assert {k for k, _, _ in checks[0].classes} == {"a", "a|b", "", "b"}

    # A record whose label id is not in the dataset's classes is reported at its offset.
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    good = shard.read_bytes()
    stray = encode_image(
        ImageRecord("/x/c.png", "c.png", 1, labels=("c",)), _png(3, 3, 9), ClassIndex(("a", "b", "c"), 1)
    )[0]
    shard.write_bytes(good + frame_record(stray))
    _, problems = verify(str(tmp_path))
    assert problems[0] == f"{shard}: offset {len(good)}: label ids [3] outside the 2 classes of summary.json"


def test_per_object_preset_gets_sequences_and_a_label_map(tmp_path):
    import tensorflow_datasets as tfds

    odapi = dataclasses.replace(
        SLIM,
        name="odapi",
        kinds={
            "image/encoded": "bytes",
            "image/object/bbox/xmin": "float",
            "image/object/class/label": "int64",
            "image/object/class/text": "bytes",
            "image/source_id": "bytes",
        },
        label_key="image/object/class/label",
        scalar=frozenset({"image/encoded", "image/source_id"}),
    )
    doc = features_json(odapi, 3, single_label=True)
    features = tfds.features.FeatureConnector.from_json(doc)
    obj = features["image"]["object"]
    assert isinstance(obj["class"]["label"], tfds.features.Sequence)
    assert obj["bbox"]["xmin"].shape == (None,) and obj["class"]["text"].shape == (None,)
    assert isinstance(features["image"]["source_id"], tfds.features.Text)

    summary = {"label_offset": 1, "labels_per_record": {"min": 1, "max": 1}}
    index = ClassIndex(("cat", 'say "hi"'), 1)
    files = write_reader_metadata(
        str(tmp_path), summary, odapi, {"train": [1]}, "gzip", class_index=index, labels_file=""
    )
    assert files == ["label_map.pbtxt"]  # gzip: no TFDS files (stale ones are retired by publish)
    assert not (tmp_path / "dataset_info.json").exists()
    assert (tmp_path / "label_map.pbtxt").read_text() == (
        'item {\n  id: 1\n  name: "cat"\n  display_name: "cat"\n}\n'
        'item {\n  id: 2\n  name: "say \\"hi\\""\n  display_name: "say \\"hi\\""\n}\n'
    )
    assert (
        "".join(label_map_pbtxt(["서울"], 1))
        == 'item {\n  id: 1\n  name: "서울"\n  display_name: "서울"\n}\n'
    )


def test_small_helpers():
    assert class_label_names(["background", "x"], 2) == ["background_1", "background_2", "background", "x"]
    assert class_label_names(["x"], 0) == ["x"]
    assert tfds_name("gs://b/My Flowers-2024/") == "my_flowers_2024"
    assert tfds_name("/tmp/2024") == "img2tfrecord_2024"
    import tensorflow_datasets as tfds

    # A key under another feature (the tfds preset's 'image' and 'image/filename') stays flat.
    nested = Schema("n", SLIM.build, {"image": "bytes", "image/x": "int64"}, "image", "image/x", frozenset())
    features = tfds.features.FeatureConnector.from_json(features_json(nested, 2, True))
    assert set(features.keys()) == {"image", "image/x"}
    assert isinstance(features["image"], tfds.features.Image)
