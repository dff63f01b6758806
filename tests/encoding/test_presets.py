"""Schema presets and image options through the real pipeline, parsed with each preset's own spec.

One shared input folder holds the awkward cases (CMYK JPEG, PNG named .jpg, EXIF-rotated
JPEG, TIFF, animated WebP and GIF, 16-bit and LA PNGs, palette BMP, an exact duplicate, a
decompression bomb) plus a class of small flat images for the shard-size check.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_pipeline import main
from transforms.encoding.schema import PRESETS, get_schema, schema_from_summary

KEPT = {"cats/rgb.jpg", "cats/png_named.jpg", "cats/rotated.jpg", "dogs/gray16.png", "dogs/la.png"}
KEPT |= {"dogs/anim.gif"}
CONVERTED = {"cats/cmyk.jpg", "dogs/scan.tiff", "dogs/anim.webp", "dogs/palette.bmp"}
FLAT = {f"birds/flat{i:02d}.png" for i in range(30)}
WRITTEN = KEPT | CONVERTED | FLAT  # cats/rgb_copy.jpg is a duplicate (with --dedupe); bomb.png fails


def _gradient(mode: str, size: tuple[int, int], seed: int) -> Image.Image:
    w, h = size
    ramp = (np.add.outer(np.arange(h) * 3, np.arange(w) * 2) + seed * 17) % 256
    rgb = np.stack([ramp, (ramp + 85) % 256, (ramp + 170) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode)


def _bomb_png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("presets") / "images"
    (root / "cats").mkdir(parents=True)
    (root / "dogs").mkdir()
    (root / "birds").mkdir()
    _gradient("RGB", (40, 30), 1).save(root / "cats" / "rgb.jpg")
    (root / "cats" / "rgb_copy.jpg").write_bytes((root / "cats" / "rgb.jpg").read_bytes())
    _gradient("CMYK", (24, 16), 2).save(root / "cats" / "cmyk.jpg")
    _gradient("RGB", (9, 11), 3).save(root / "cats" / "png_named.jpg", format="PNG")
    exif = Image.Exif()
    exif[0x0112] = 6
    _gradient("RGB", (40, 20), 4).save(root / "cats" / "rotated.jpg", exif=exif)
    _gradient("RGB", (30, 20), 5).save(root / "dogs" / "scan.tiff")
    frames = [_gradient("RGB", (16, 12), i) for i in range(3)]
    frames[0].save(root / "dogs" / "anim.webp", save_all=True, append_images=frames[1:])
    gif = [f.convert("P") for f in frames]
    gif[0].save(root / "dogs" / "anim.gif", save_all=True, append_images=gif[1:])
    gray16 = (np.add.outer(np.arange(12), np.arange(14)) * 300).astype(np.uint16)
    Image.fromarray(gray16).save(root / "dogs" / "gray16.png")
    _gradient("LA", (10, 10), 6).save(root / "dogs" / "la.png")
    _gradient("P", (15, 9), 7).save(root / "dogs" / "palette.bmp")
    (root / "dogs" / "bomb.png").write_bytes(_bomb_png(50_000, 50_000))
    for i in range(30):
        _gradient("RGB", (64, 48), 10 + i).save(root / "birds" / f"flat{i:02d}.png")
    return root


def _convert(dataset: Path, out: Path, *args: str) -> dict:
    return main.run(
        ["--input", str(dataset), "--output_dir", str(out), "--quiet", "--max_failure_ratio", "1", *args],
        save_main_session=False,
    )


def _examples(out: Path, spec: dict) -> list[dict]:
    shards = sorted(glob.glob(str(out / "train-*-of-*.tfrecord")))
    return [tf.io.parse_single_example(raw, spec) for raw in tf.data.TFRecordDataset(shards)]


def _text(t) -> str:
    return t.numpy().decode("utf-8")


def _failures(out: Path) -> dict[str, str]:
    lines = (out / "failures.jsonl").read_text().splitlines()
    return {os.path.basename(f["path"]): f["reason"] for f in map(json.loads, lines)}


def test_slim_default_keeps_or_converts_and_dedupes(dataset, tmp_path):
    out = tmp_path / "slim"
    summary = _convert(dataset, out, "--dedupe")
    assert summary["listed"] == summary["written"] + summary["failed"] == len(WRITTEN) + 2
    assert summary["duplicates"] == 1 and summary["failed_by_stage"] == {"decode": 1, "dedupe": 1}
    assert (summary["schema"], summary["store"], summary["rename_keys"]) == ("slim", "encoded", {})
    failures = _failures(out)
    assert failures["rgb_copy.jpg"] == "duplicate of cats/rgb.jpg"
    assert failures["bomb.png"].startswith("too large: more than 178956970 pixels")

    schema = schema_from_summary(json.loads((out / "summary.json").read_text()))
    examples = {_text(ex["image/filename"]): ex for ex in _examples(out, schema.parse_spec())}
    assert set(examples) == WRITTEN
    for name, ex in examples.items():
        encoded = ex["image/encoded"].numpy()
        decoded = tf.io.decode_image(encoded, expand_animations=False)
        stored = (int(ex["image/height"]), int(ex["image/width"]), int(ex["image/channels"]))
        assert tuple(decoded.shape) == stored, name
        assert _text(ex["image/key/sha256"]) == hashlib.sha256(encoded).hexdigest()
        assert (encoded == (dataset / name).read_bytes()) is (name not in CONVERTED), name
        assert _text(ex["image/class/text"].values[0]) == name.split("/")[0]
    assert _text(examples["cats/cmyk.jpg"]["image/format"]) == "png"
    assert _text(examples["cats/png_named.jpg"]["image/format"]) == "png"
    assert int(examples["cats/rotated.jpg"]["image/height"]) == 20  # EXIF not applied by default
    assert int(examples["dogs/la.png"]["image/channels"]) == 2


def test_tutorial_raw_pixels_and_shards_planned_by_converted_size(dataset, tmp_path):
    out = tmp_path / "tutorial"
    args = ["--schema", "tutorial", "--store", "raw", "--resize", "32x24", "--resize_mode", "crop"]
    summary = _convert(dataset, out, *args, "--color", "rgb", "--shard_size_mb", "0.02")
    assert summary["written"] == len(WRITTEN) + 1 and summary["store"] == "raw"  # no --dedupe
    examples = _examples(out, PRESETS["tutorial"].parse_spec())
    assert len(examples) == summary["written"]
    for ex in examples:
        assert (int(ex["height"]), int(ex["width"]), int(ex["depth"])) == (24, 32, 3)
        pixels = tf.io.decode_raw(ex["image_raw"], tf.uint8)
        assert pixels.shape == (24 * 32 * 3,)
        assert int(ex["label"]) in (0, 1, 2)
    # Flat PNGs are ~100x smaller than their raw pixels; planning by file size would put
    # everything into one shard. Shards hold ~8 records of ~2,500 bytes here: the plan places
    # each shard's two ends within about a record of the target's (transforms/layout/plan.py),
    # so every shard but the last is within two records of the target.
    sizes = [os.path.getsize(p) for p in sorted(glob.glob(str(out / "train-*.tfrecord")))]
    target, record = 0.02 * 1024 * 1024, 24 * 32 * 3 + 200
    assert len(sizes) >= 5 and all(abs(s - target) < 2 * record for s in sizes[:-1]), sizes


def test_tfds_records_deserialize_with_tfds_features(dataset, tmp_path):
    import tensorflow_datasets as tfds

    out = tmp_path / "tfds"
    summary = _convert(dataset, out, "--schema", "tfds", "--max_side", "20")
    names = (out / "labels.txt").read_text().splitlines()
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(),
            "label": tfds.features.ClassLabel(names=names),
            "image/filename": tfds.features.Text(),
        }
    )
    shards = sorted(glob.glob(str(out / "train-*-of-*.tfrecord")))
    seen = {}
    for raw in tf.data.TFRecordDataset(shards):
        ex = features.deserialize_example(raw)
        seen[_text(ex["image/filename"])] = (names[int(ex["label"])], tuple(ex["image"].shape))
    assert len(seen) == summary["written"] == len(WRITTEN) + 1
    assert seen["cats/rgb.jpg"] == ("cats", (15, 20, 3))  # 40x30 scaled to a longer side of 20
    assert seen["dogs/la.png"] == ("dogs", (10, 10, 3))  # small images are not upscaled
    assert seen["dogs/anim.gif"] == ("dogs", (12, 16, 3))  # first frame: TFDS decodes GIFs as 4-D
    assert {p for p, _ in seen.values()} == {"birds", "cats", "dogs"}


def test_odapi_ids_from_one_exif_and_custom_renames(dataset, tmp_path):
    out = tmp_path / "odapi"
    args = ["--schema", "odapi", "--exif_transpose", "--image_format", "jpeg", "--jpeg_quality", "80"]
    summary = _convert(dataset, out, *args, "--rename_keys", "image/source_id=image/id")
    assert summary["rename_keys"] == {"image/source_id": "image/id"} and summary["label_offset"] == 1
    schema = schema_from_summary(summary)
    assert "image/id" in schema.parse_spec() and "image/source_id" not in schema.parse_spec()
    examples = {_text(ex["image/filename"]): ex for ex in _examples(out, schema.parse_spec())}
    assert len(examples) == summary["written"] == len(WRITTEN) + 1
    ids = {
        _text(ex["image/class/text"].values[0]): int(ex["image/class/label"].values[0])
        for ex in examples.values()
    }
    assert ids == {"birds": 1, "cats": 2, "dogs": 3}
    for name, ex in examples.items():
        decoded = tf.io.decode_image(ex["image/encoded"], expand_animations=False)
        assert tuple(decoded.shape[:2]) == (int(ex["image/height"]), int(ex["image/width"])), name
        assert _text(ex["image/format"]) == "jpeg" and _text(ex["image/id"]) == name
    rotated = examples["cats/rotated.jpg"]
    assert (int(rotated["image/height"]), int(rotated["image/width"])) == (40, 20)  # EXIF applied


@pytest.mark.parametrize(
    "args,message",
    [
        (["--schema", "tfds", "--store", "raw"], "expect encoded images"),
        (["--schema", "tfds", "--label_offset", "1"], "needs class ids from 0"),
        (["--resize", "10x"], "expected WxH"),
        (["--resize", "10x10", "--max_side", "5"], "exclude each other"),
        (["--rename_keys", "image/nope=x"], "is not a key of the slim schema"),
        (["--rename_keys", "image/format=image/width"], "the same key"),
        (["--jpeg_quality", "0"], "between 1 and 100"),
        (["--schema", "coco"], "invalid choice"),
    ],
)
def test_bad_image_options_are_one_line_user_errors(tmp_path, capsys, args, message):
    (tmp_path / "in" / "c").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "in" / "c" / "x.png")
    argv = ["--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "o"), *args]
    assert main.main(argv) == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_get_schema_api_for_readers():
    for name, schema in PRESETS.items():
        spec = schema.parse_spec()
        assert set(spec) == set(schema.kinds) and schema.image_key in spec and schema.label_key in spec
        assert schema.roles["sha256"] == "image/key/sha256" and schema.name == name
    assert get_schema("odapi").label_offset == 1 and get_schema("tfds").label_offset == 0
    renamed = get_schema("slim", {"image/encoded": "img"})
    assert renamed.image_key == "img" and renamed.roles["image"] == "img"
    with pytest.raises(ValueError, match="unknown schema"):
        get_schema("coco")
