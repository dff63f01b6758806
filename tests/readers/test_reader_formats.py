"""Every stored format and store mode reads back in every reader: TFDS, load_dataset,
parse_spec, verify --all, inspect, and the tfds/odapi presets' decoders.

Real-ish files: WebPs written by Pillow (lossless and lossy), a PNG with alpha, a grey PNG,
a JPEG and a single-frame GIF.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_pipeline import load_dataset, main, parse_spec
from beam_pipeline.readers.inspect import collect_stats
from beam_pipeline.readers.verify import verify
from tests.conftest import write_image
from transforms.encoding.schema import get_schema
from transforms.images.check import detect_format
from transforms.images.decoding import DECODED_4D_FORMATS
from transforms.output.tfds import FEATURES_FILE, features_json


def _pixels(size, mode, seed):
    rng = np.random.default_rng(seed)
    w, h = size
    return Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8).squeeze(), mode)


def _encoded(fmt: str, mode: str = "RGB", size=(7, 5), seed: int = 0, **kw) -> bytes:
    out = io.BytesIO()
    _pixels(size, mode, seed).save(out, format=fmt, **kw)
    return out.getvalue()


# name -> bytes; every format TensorFlow decodes, as Pillow writes them.
SAMPLES = {
    "lossless.webp": lambda: _encoded("WEBP", lossless=True, seed=1),
    "lossy.webp": lambda: _encoded("WEBP", quality=80, seed=2),
    "alpha.webp": lambda: _encoded("WEBP", "RGBA", lossless=True, seed=3),
    "alpha.png": lambda: _encoded("PNG", "RGBA", seed=4),
    "grey.png": lambda: _encoded("PNG", "L", seed=5),
    "photo.jpg": lambda: _encoded("JPEG", seed=6),
    "single.gif": lambda: _encoded("GIF", "L", seed=7),
    "plain.bmp": lambda: _encoded("BMP", seed=8),
}


def _tree(root: Path, names=tuple(SAMPLES)) -> Path:
    for i, name in enumerate(names):
        path = root / ("a" if i % 2 else "b") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(SAMPLES[name]())
    return root


def _convert(root: Path, out: Path, *flags: str) -> dict:
    return main.run(
        ["--input", str(root), "--output_dir", str(out), "--quiet", *flags], save_main_session=False
    )


def _tfds_examples(out: Path) -> list[dict]:
    import tensorflow_datasets as tfds

    return list(tfds.as_numpy(tfds.builder_from_directory(str(out)).as_dataset(split="train")))


def test_the_formats_tensorflow_decodes_4d_by_default():
    """DECODED_4D_FORMATS is what TensorFlow 2.21 does, single-frame files included."""
    four_d = set()
    for name, make in SAMPLES.items():
        data = make()
        fmt = detect_format(data)
        assert fmt == name.rsplit(".", 1)[1].replace("jpg", "jpeg")
        assert tuple(tf.io.decode_image(data, expand_animations=False).shape)[:2] == (5, 7)
        if len(tf.io.decode_image(data).shape) == 4:  # expand_animations=True by default
            four_d.add(fmt)
    assert four_d == set(DECODED_4D_FORMATS) == {"gif", "webp"}


def test_webp_dataset_loads_in_tfds_load_dataset_and_verify(tmp_path):
    out = tmp_path / "out"
    summary = _convert(_tree(tmp_path / "in"), out)
    assert summary["written"] == len(SAMPLES)

    examples = _tfds_examples(out)  # the bytes, decodable with expand_animations=False
    shapes = {
        tf.io.decode_image(ex["image"]["encoded"], expand_animations=False).shape[:2] for ex in examples
    }
    assert len(examples) == len(SAMPLES) and shapes == {(5, 7)}
    images = [image.numpy() for image, _ in load_dataset(str(out))]
    assert len(images) == len(SAMPLES) and all(i.shape == (5, 7, 3) for i in images)
    checks, problems = verify(str(out), decode_all=True)
    assert problems == [] and sum(c.decoded for c in checks) == len(SAMPLES)


@pytest.mark.parametrize("preset", ["tfds", "odapi"])
def test_tfds_and_odapi_presets_store_what_their_decoders_read_as_3d(tmp_path, preset):
    out = tmp_path / "out"
    _convert(_tree(tmp_path / "in"), out, "--schema", preset)
    key = get_schema(preset).image_key
    stored = [
        tf.io.parse_single_example(r, {key: tf.io.FixedLenFeature([], tf.string)})[key].numpy()
        for r in tf.data.TFRecordDataset(sorted(str(p) for p in out.glob("train-*.tfrecord")))
    ]
    assert len(stored) == len(SAMPLES)
    for data in stored:  # the consumer's call: decode_image with expand_animations=True
        assert detect_format(data) not in DECODED_4D_FORMATS
        assert len(tf.image.decode_image(data, channels=3).shape) == 3
    if preset == "tfds":
        examples = _tfds_examples(out)
        assert sorted(ex["image"].shape for ex in examples) == [(5, 7, 3)] * len(SAMPLES)
    _, problems = verify(str(out), decode_all=True)
    assert problems == []


def test_verify_all_fails_where_tfds_image_would_decode_4d(tmp_path):
    out = tmp_path / "out"
    _convert(_tree(tmp_path / "in", ["lossy.webp", "alpha.png"]), out)
    _, problems = verify(str(out), decode_all=True)
    assert problems == []
    # features.json as it was written before WebPs counted as 4-D: TFDS's as_dataset fails.
    bad = tmp_path / "declared_image"
    shutil.copytree(out, bad)
    summary = json.loads((out / "summary.json").read_text())
    doc = features_json(get_schema("slim"), summary["num_classes"], True)
    (bad / FEATURES_FILE).write_text(json.dumps(doc))
    with pytest.raises(Exception, match="(?i)shape|rank|dimension"):
        _tfds_examples(bad)
    for decode_all in (True, False):  # the format check covers records the sample skips
        _, problems = verify(str(bad), decode_all=decode_all)
        assert len(problems) == 1 and "4-D" in problems[0] and "TFDS's Image feature" in problems[0]


@pytest.mark.parametrize("preset", ["slim", "tutorial"])
def test_raw_pixels_read_back_everywhere(tmp_path, preset):
    # Lossless sources only: the pixels must match TensorFlow's decode bit for bit.
    names = ["alpha.png", "grey.png", "plain.bmp", "lossless.webp", "alpha.webp"]
    root = _tree(tmp_path / "in", names)
    out = tmp_path / "out"
    summary = _convert(root, out, "--store", "raw", "--schema", preset)
    assert summary["written"] == len(names) and summary["store"] == "raw"

    expected = {}  # pixels by image size and content, as decode_image gives them
    for path in root.rglob("*.*"):
        data = path.read_bytes()
        expected[path.name] = tf.io.decode_image(data, expand_animations=False).numpy()
    got = sorted((image.numpy().tobytes(), image.shape) for image, _ in load_dataset(str(out), channels=0))
    want = sorted((p.tobytes(), p.shape) for p in expected.values())
    assert got == want
    rgb = [image.numpy() for image, _ in load_dataset(str(out))]  # channels=3: alpha dropped, grey repeated
    want_rgb = [np.repeat(p, 3, -1) if p.shape[-1] < 3 else p[..., :3] for p in expected.values()]
    assert sorted(i.tobytes() for i in rgb) == sorted(p.tobytes() for p in want_rgb)
    resized = next(iter(load_dataset(str(out), image_size=(4, 4), batch_size=len(names))))[0]
    assert resized.shape == (len(names), 4, 4, 3)

    checks, problems = verify(str(out), decode_all=True)
    assert problems == [] and sum(c.decoded for c in checks) == len(names)
    stats = collect_stats(str(out), samples_per_class=2)
    assert stats.bad == [] and sum(len(s) for s in stats.samples.values()) == 4
    for samples in stats.samples.values():
        assert all(Image.open(io.BytesIO(image)).format == "PNG" for image, *_ in samples)

    # TFDS: a flat uint8 vector, reshaped by the stored shape.
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(out))
    key = get_schema(preset).image_key
    shape_keys = [get_schema(preset).roles[r] for r in ("height", "width", "channels")]

    def pick(ex, k):  # TFDS nests features at '/'
        for part in k.split("/"):
            ex = ex[part]
        return ex

    pixels = []
    for ex in tfds.as_numpy(builder.as_dataset(split="train")):
        flat = pick(ex, key)
        assert flat.dtype == np.uint8 and flat.ndim == 1
        pixels.append(flat.reshape([int(pick(ex, k)) for k in shape_keys]).tobytes())
    assert sorted(pixels) == sorted(p.tobytes() for p in expected.values())


def test_verify_names_raw_pixels_that_do_not_fit_their_shape(tmp_path):
    from tests.conftest import frame_record
    from transforms.encoding.tfrecord import iter_records

    out = tmp_path / "out"
    _convert(_tree(tmp_path / "in", ["grey.png"]), out, "--store", "raw")
    shard = next(out.glob("train-*.tfrecord"))
    with open(shard, "rb") as f:
        [(_, data)] = list(iter_records(f))
    example = tf.train.Example.FromString(data)
    example.features.feature["image/encoded"].bytes_list.value[0] = b"\x00" * 7
    shard.write_bytes(frame_record(example.SerializeToString()))
    (out / "train-00000-of-00001.tfrecord.idx").unlink(missing_ok=True)
    _, problems = verify(str(out), decode_all=True)
    assert any("raw pixels are 7 bytes" in p for p in problems)


def test_renamed_keys_are_honoured_by_parse_spec_load_dataset_and_verify(tmp_path):
    out = tmp_path / "out"
    renames = "image/encoded=jpeg_bytes,image/class/label=y,image/height=h"
    _convert(_tree(tmp_path / "in", ["alpha.png", "photo.jpg"]), out, "--rename_keys", renames)
    spec = parse_spec(str(out))
    assert {"jpeg_bytes", "y", "h"} <= set(spec) and "image/encoded" not in spec
    for record in tf.data.TFRecordDataset(sorted(str(p) for p in out.glob("train-*.tfrecord"))):
        tf.io.parse_single_example(record, spec)  # every declared key is there
    pairs = [(image.shape, int(label)) for image, label in load_dataset(str(out))]
    assert sorted(pairs) == [((5, 7, 3), 0), ((5, 7, 3), 1)]
    checks, problems = verify(str(out), decode_all=True)
    assert problems == [] and sum(c.decoded for c in checks) == 2
    assert collect_stats(str(out)).bad == []
    examples = _tfds_examples(out)  # features.json names the renamed keys
    assert sorted((ex["jpeg_bytes"].shape, int(ex["y"]), int(ex["h"])) for ex in examples) == [
        ((5, 7, 3), 0, 5),
        ((5, 7, 3), 1, 5),
    ]


def test_tfds_preset_with_a_real_photo_like_webp(tmp_path):
    """A larger lossy WebP (gradients, like a wallpaper) goes through the tfds preset to TFDS."""
    w, h = 160, 90
    x = np.linspace(0, 255, w, dtype=np.float32)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    rgb = np.stack([np.broadcast_to(x, (h, w)), np.broadcast_to(y, (h, w)), (x + y) / 2 % 256], -1)
    path = tmp_path / "in" / "wallpapers" / "sky.webp"
    path.parent.mkdir(parents=True)
    Image.fromarray(rgb.astype(np.uint8)).save(path, format="WEBP", quality=70)
    write_image(tmp_path / "in" / "photos" / "p.png", (9, 6), "RGBA", seed=3)
    out = tmp_path / "out"
    _convert(tmp_path / "in", out, "--schema", "tfds")
    shapes = sorted(ex["image"].shape for ex in _tfds_examples(out))
    assert shapes == [(6, 9, 3), (h, w, 3)]
