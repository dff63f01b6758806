"""Readers of the output: TFDS, load_dataset, index files, verify and inspect.

One module-scoped conversion (two splits, two shards each, index files) is shared by the
tests; the ones that damage it work on copies.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline import load_dataset, main, parse_spec
from tests.conftest import chromium_screenshot, frame_record, read_records, write_image
from transforms.encoding.schema import get_schema
from transforms.encoding.tfrecord import iter_records
from transforms.writing.index import parse_index

CLASSES = ["cat", "dog house", "서울광장"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A converted dataset: 3 classes x 6 images (JPEG, PNG gray/RGBA, BMP), train/validation."""
    root = tmp_path_factory.mktemp("readers") / "images"
    modes = [
        ("RGB", "a.jpg"),
        ("L", "b.png"),
        ("RGBA", "c.png"),
        ("RGB", "d.bmp"),
        ("RGB", "e.jpeg"),
        ("L", "f.jpg"),
    ]
    for c, cls in enumerate(CLASSES):
        for i, (mode, name) in enumerate(modes):
            write_image(root / cls / name, (12 + 3 * i, 10 + 2 * c), mode, seed=10 * c + i)
    out = root.parent / "out"
    summary = main.run(
        [
            "--input",
            str(root),
            "--output_dir",
            str(out),
            "--splits",
            "train=0.6,validation=0.4",
            "--num_shards",
            "2",
            "--write_index",
            "--quiet",
        ],
        save_main_session=False,
    )
    assert summary["written"] == 18 and summary["failed"] == 0
    assert {s for s, v in summary["splits"].items() if v["written"]} == {"train", "validation"}
    return out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("*-of-*.tfrecord"))


def test_tfds_loads_every_split_with_counts_features_and_class_names(converted):
    import tensorflow_datasets as tfds

    summary = _summary(converted)
    builder = tfds.builder_from_directory(str(converted))
    label_feature = builder.info.features["image"]["class"]["label"]
    assert label_feature.names == CLASSES
    for split, info in summary["splits"].items():
        assert builder.info.splits[split].num_examples == info["written"]
        examples = list(builder.as_dataset(split=split))
        assert len(examples) == info["written"]
        per_class = collections.Counter()
        for ex in examples:
            image = ex["image"]
            assert tuple(image["encoded"].shape) == (int(image["height"]), int(image["width"]), 3)
            name = label_feature.int2str(int(image["class"]["label"]))
            assert image["filename"].numpy().decode("utf-8").split("/")[0] == name
            assert [t.decode("utf-8") for t in image["class"]["text"].numpy()] == [name]
            per_class[name] += 1
        assert per_class == {k: v["written"] for k, v in info["classes"].items() if v["written"]}


def test_load_dataset_round_trip_matches_tensorflow_read_back(converted):
    import numpy as np

    summary = _summary(converted)
    for split, info in summary["splits"].items():
        loaded = [
            (int(label), image.numpy()) for image, label in load_dataset(str(converted), split, channels=0)
        ]
        expected = read_records(converted, split)
        assert len(loaded) == info["written"] == len(expected)

        def key(label, pixels):
            return (label, pixels.shape, int(pixels.sum()))

        import tensorflow as tf

        want = sorted(
            key(r["label"][0], tf.io.decode_image(r["encoded"], expand_animations=False).numpy())
            for r in expected
        )
        assert sorted(key(label, px) for label, px in loaded) == want

    batches = list(
        load_dataset(str(converted), "train", image_size=(8, 6), batch_size=4, shuffle_files=True, seed=1)
    )
    assert sum(b[0].shape[0] for b in batches) == summary["splits"]["train"]["written"]
    assert all(tuple(b[0].shape[1:]) == (8, 6, 3) for b in batches)
    assert set(np.concatenate([b[1].numpy() for b in batches])) <= {0, 1, 2}
    with pytest.raises(FileNotFoundError, match="splits: train, validation"):
        load_dataset(str(converted), "test")


def test_parse_spec_is_the_schema_spec(converted):
    import tensorflow as tf

    spec = parse_spec(str(converted))
    assert spec.keys() == get_schema("slim").parse_spec().keys() == parse_spec("slim").keys()
    raw = next(iter(tf.data.TFRecordDataset([str(_shards(converted)[0])])))
    ex = tf.io.parse_single_example(raw, spec)
    assert ex["image/format"].numpy().decode() in {"jpeg", "png", "bmp"}


def test_index_files_point_at_each_record(converted):
    import tensorflow as tf

    shards = _shards(converted)
    assert len(shards) == 4
    for shard in shards:
        entries = parse_index(Path(str(shard) + ".idx").read_text())
        data = shard.read_bytes()
        records = [r.numpy() for r in tf.data.TFRecordDataset([str(shard)])]
        assert len(entries) == len(records) > 0
        assert entries[0][0] == 0 and sum(entries[-1]) == len(data)
        for (offset, length), record in zip(entries, records, strict=True):
            assert data[offset : offset + length] == frame_record(record)
        with open(shard, "rb") as f:
            assert [(o, len(r)) for o, r in iter_records(f)] == [(o, n - 16) for o, n in entries]


def _run_cli(argv, capsys) -> tuple[int, str, str]:
    code = main.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_verify_passes_on_good_output_and_names_flipped_and_truncated_shards(converted, tmp_path, capsys):
    code, out, err = _run_cli(["verify", str(converted), "--all"], capsys)
    assert code == 0, err
    assert "OK: 18 records in 4 shards, 18 images decoded" in out

    flipped = tmp_path / "flipped"
    shutil.copytree(converted, flipped)
    shard = _shards(flipped)[1]
    entries = parse_index(Path(str(shard) + ".idx").read_text())
    offset, length = entries[1]
    data = bytearray(shard.read_bytes())
    data[offset + length // 2] ^= 0x01  # one bit inside the second record's Example
    shard.write_bytes(bytes(data))
    code, out, err = _run_cli(["verify", str(flipped)], capsys)
    assert code == 1
    assert err.splitlines()[0] == f"img2tfrecord verify: FAILED: {shard}: offset {offset}: data CRC mismatch"
    # The same through a Beam pipeline (one element per shard).
    code, out, err = _run_cli(["verify", str(flipped), "--beam"], capsys)
    assert code == 1 and f"{shard}: offset {offset}: data CRC mismatch" in err.splitlines()[0]
    assert (flipped / "verify.json").exists()
    code, out, err = _run_cli(["inspect", str(flipped)], capsys)
    lines = out.splitlines()
    assert code == 1 and lines[0] == f"BAD SHARD {shard}: offset {offset}: data CRC mismatch", lines
    # No plain count for the damaged split: the shard's records past the damage are not in it.
    split = shard.name.split("-")[0]
    (line,) = [line for line in lines if line.startswith(f"{split}: ")]
    assert line.startswith(f"{split}: at least ") and line.endswith("(1 bad shard)"), line

    truncated = tmp_path / "truncated"
    shutil.copytree(converted, truncated)
    shard = _shards(truncated)[2]
    entries = parse_index(Path(str(shard) + ".idx").read_text())
    offset, length = entries[-1]
    shard.write_bytes(shard.read_bytes()[: offset + length - 7])
    code, out, err = _run_cli(["verify", str(truncated)], capsys)
    assert code == 1
    assert err.startswith(f"img2tfrecord verify: FAILED: {shard}: offset {offset}: truncated record")

    missing = tmp_path / "missing"
    shutil.copytree(converted, missing)
    _shards(missing)[0].unlink()
    code, out, err = _run_cli(["verify", str(missing)], capsys)
    assert code == 1 and "do not form 0..N-1" in err

    code, out, err = _run_cli(["verify", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and err.count("\n") == 1 and err.endswith("nowhere: no such folder\n")


class _ReportParser(HTMLParser):
    """Checks that tags nest properly and collects images, headings and svg bars."""

    VOID = {"meta", "img", "br", "link", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.images: list[tuple[str, str]] = []
        self.headings: list[str] = []
        self.bars = 0
        self._in_h3 = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append((attrs["src"], attrs["alt"]))
        if tag == "rect":
            self.bars += 1
        self._in_h3 = tag == "h3"
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        if self._in_h3:
            self.headings.append(data)
            self._in_h3 = False


def test_inspect_prints_counts_and_writes_a_self_contained_report(converted, tmp_path, capsys):
    report = tmp_path / "report.html"
    code, out, err = _run_cli(["inspect", str(converted), "--report", str(report), "--samples", "3"], capsys)
    assert code == 0, err
    summary = _summary(converted)
    for split, info in summary["splits"].items():
        assert f"{split}: {info['written']} records" in out
        for cls, counts in info["classes"].items():
            if counts["written"]:
                assert re.search(rf"^  {re.escape(cls)} +{counts['written']} ", out, re.M), out

    page = report.read_text(encoding="utf-8")
    parser = _ReportParser()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # The samples come last, one heading per class; bars: classes per split, formats, sizes.
    assert parser.headings[-len(CLASSES) :] == CLASSES and parser.bars >= 3
    per_class = collections.Counter(alt for _, alt in parser.images)
    assert per_class == {c: 3 for c in CLASSES}
    for src, _ in parser.images:
        assert src.startswith("data:image/png;base64,")
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as img:
            assert img.format == "PNG" and max(img.size) <= 128
            img.load()


def test_gzip_output_verifies_and_loads_without_tfds_files(tmp_path, capsys):
    root = tmp_path / "images"
    for i, cls in enumerate(CLASSES[:2]):
        write_image(root / cls / "x.png", (7, 5), seed=i)
    out = tmp_path / "out"
    main.run(["--input", str(root), "--output_dir", str(out), "--compression", "gzip", "--quiet"], False)
    assert not (out / "dataset_info.json").exists() and not list(out.glob("*.idx"))
    code, stdout, err = _run_cli(["verify", str(out)], capsys)
    assert code == 0 and "OK: 2 records in 1 shards" in stdout, err
    assert sorted(int(label) for _, label in load_dataset(str(out))) == [0, 1]
    code, _, err = _run_cli(
        [
            "--input",
            str(root),
            "--output_dir",
            str(tmp_path / "o2"),
            "--compression",
            "gzip",
            "--write_index",
        ],
        capsys,
    )
    assert code == 2 and "--write_index" in err


def test_gif_datasets_give_tfds_the_encoded_bytes(tmp_path):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    root = tmp_path / "images"
    write_image(root / "a" / "x.gif", (6, 4), "P", seed=1)
    write_image(root / "b" / "y.png", (5, 3), seed=2)
    out = tmp_path / "out"
    main.run(["--input", str(root), "--output_dir", str(out), "--quiet"], False)
    builder = tfds.builder_from_directory(str(out))
    assert isinstance(builder.info.features["image"]["encoded"], tfds.features.Text)
    shapes = sorted(
        tuple(tf.io.decode_image(ex["image"]["encoded"], expand_animations=False).shape)
        for ex in builder.as_dataset(split="train")
    )
    assert shapes == [(3, 5, 3), (4, 6, 3)]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed")
def test_report_renders_in_headless_chromium(converted, tmp_path, capsys):
    report, shot = tmp_path / "report.html", tmp_path / "shot.png"
    assert _run_cli(["inspect", str(converted), "--report", str(report)], capsys)[0] == 0
    chromium_screenshot(report, shot, 900, 2400)  # the samples come after the failures and distributions
    import numpy as np

    with Image.open(shot) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int32).reshape(-1, 3)
    assert img.size == (900, 2400)
    bar = int((np.abs(pixels - [0x4A, 0x7B, 0xD0]).sum(axis=1) < 12).sum())
    assert bar > 3 * 100  # the three histogram bars were drawn
    assert len(np.unique(pixels, axis=0)) > 1000  # and the (random-noise) sample images


@pytest.fixture
def gcs_bucket(monkeypatch):
    """A gcp-storage-emulator server (in memory) with bucket 'bkt'; yields a storage client."""
    import socket

    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bkt")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    try:
        yield storage.Client(credentials=AnonymousCredentials(), project="test").bucket("bkt")
    finally:
        server.stop()


def test_verify_and_inspect_read_gcs(converted, gcs_bucket, tmp_path, capsys):
    for path in converted.iterdir():
        data = path.read_bytes()
        if path.name == _shards(converted)[3].name:  # damage one shard on the way up
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        gcs_bucket.blob(f"out/{path.name}").upload_from_string(data)
    code, out, err = _run_cli(["inspect", "gs://bkt/out", "--report", "gs://bkt/report.html"], capsys)
    assert code == 1 and "validation: " in out
    assert gcs_bucket.blob("report.html").download_as_bytes().startswith(b"<!DOCTYPE html>")
    code, out, err = _run_cli(["verify", "gs://bkt/out"], capsys)
    entries = parse_index(Path(str(_shards(converted)[3]) + ".idx").read_text())
    bad = f"gs://bkt/out/{_shards(converted)[3].name}: offset {entries[-1][0]}: data CRC mismatch"
    assert code == 1 and err.splitlines()[0] == f"img2tfrecord verify: FAILED: {bad}"
