"""The image check agrees with tf.io.decode_image, and rejects what TensorFlow cannot read."""

import io

import pytest
import tensorflow as tf
from PIL import Image

from tests.conftest import write_image
from transforms.images.check import detect_format
from transforms.images.convert import prepare_image
from transforms.images.types import ImageError, ImageOptions


def inspect_image(data, max_pixels=None):
    """What the check says TensorFlow decodes `data` to, kept as it is."""
    prepared = prepare_image(data, ImageOptions(max_pixels=max_pixels) if max_pixels else ImageOptions())
    assert prepared.converted is None and prepared.data is data
    return prepared.info


SUPPORTED = [
    ("JPEG", "RGB"),
    ("JPEG", "L"),
    ("PNG", "RGB"),
    ("PNG", "RGBA"),
    ("PNG", "L"),
    ("PNG", "LA"),
    ("PNG", "P"),
    ("PNG", "1"),
    ("GIF", "P"),
    ("GIF", "L"),
    ("BMP", "RGB"),
]


@pytest.mark.parametrize("fmt,mode", SUPPORTED)
def test_dims_match_tensorflow_decode(tmp_path, fmt, mode):
    path = write_image(tmp_path / f"x.{fmt.lower()}", (13, 7), mode, fmt=fmt)
    data = path.read_bytes()
    info = inspect_image(data)
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert (info.height, info.width, info.channels) == tuple(decoded.shape)
    assert info.format == fmt.lower()


def test_format_from_content_not_extension(tmp_path):
    path = write_image(tmp_path / "really_png.jpg", (5, 5), "RGB", fmt="PNG")
    assert detect_format(path.read_bytes()) == "png"
    assert inspect_image(path.read_bytes()).format == "png"


@pytest.mark.parametrize(
    "data,reason",
    [
        (b"", "empty file"),
        (b"<html><body>not an image</body></html>", "not an image"),
        (b"\xff\xd8\xff\xe0garbage", "does not decode"),
    ],
)
def test_bad_bytes_are_rejected_with_reason(data, reason):
    with pytest.raises(ImageError, match=reason):
        inspect_image(data)


def test_truncated_jpeg_is_rejected(tmp_path):
    data = write_image(tmp_path / "t.jpg", (64, 64)).read_bytes()
    with pytest.raises(ImageError, match="does not decode"):
        inspect_image(data[: len(data) // 2])


def test_pixel_limit():
    buf = io.BytesIO()
    Image.new("L", (300, 300)).save(buf, "PNG")
    with pytest.raises(ImageError, match="too large"):
        inspect_image(buf.getvalue(), max_pixels=300 * 300 - 1)
    assert inspect_image(buf.getvalue(), max_pixels=300 * 300).width == 300
