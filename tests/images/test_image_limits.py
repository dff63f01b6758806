"""Sides TensorFlow's decoders refuse whatever the pixel count: such an image is neither
kept nor converted into a format that TensorFlow then refuses (transforms/images/check.py
`_check_sides`)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.conftest import tf_shape
from transforms.encoding.encoder import check_image
from transforms.images.types import ImageError, ImageOptions


def _encoded(size, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("L", size).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(1_000_000, 1), (1, 1_000_000)])
def test_a_png_with_the_longest_side_tensorflow_reads_is_kept(size):
    data = _encoded(size, "PNG")
    prepared = check_image(data)
    assert prepared.data == data
    assert tf_shape(data) == (size[1], size[0], 1)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_a_side_over_a_million_pixels_is_refused_not_written_for_tensorflow_to_refuse(fmt):
    data = _encoded((1_000_001, 1), fmt)
    if fmt == "PNG":
        assert tf_shape(data) is None  # libpng's limit, in TensorFlow 2.21
    with pytest.raises(ImageError, match="too wide: 1000001x1 has a side over 1,000,000 pixels"):
        check_image(data)


def test_a_jpeg_cannot_be_asked_for_beyond_its_16_bit_sides():
    with pytest.raises(ImageError, match="too wide: 70000x1 has a side over 65,500 pixels"):
        check_image(_encoded((70_000, 1), "PNG"), ImageOptions(image_format="jpeg"))


def test_a_jpeg_side_is_limited_to_libjpegs_65500_pixels():
    # libjpeg's JPEG_MAX_DIMENSION (jmorecfg.h), below the format's 16-bit 65,535: libjpeg-turbo
    # (Pillow's encoder, TensorFlow's decoder) refuses a longer side.
    data = _encoded((65_501, 1), "PNG")
    with pytest.raises(ImageError, match="too wide: 65501x1 has a side over 65,500 pixels"):
        check_image(data, ImageOptions(image_format="jpeg"))
    assert check_image(_encoded((65_500, 1), "PNG"), ImageOptions(image_format="jpeg")).info.width == 65_500
