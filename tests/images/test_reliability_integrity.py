"""PNG completeness: what Pillow forgives but TensorFlow rejects must fail the image check."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from transforms.images.check import check_png_chunks
from transforms.images.types import ImageError


def _png(size=(30, 20)) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise(size, 40).convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("cut", [1, 4, 12, 20])
def test_png_cut_short_is_rejected_like_tensorflow_does(cut):
    import tensorflow as tf

    data = _png()[:-cut]
    Image.open(io.BytesIO(data)).load()  # Pillow alone accepts it...
    with pytest.raises(tf.errors.InvalidArgumentError):  # ...TensorFlow does not,
        tf.io.decode_image(data, expand_animations=False)
    with pytest.raises(ImageError, match="truncated png"):  # and neither do we.
        check_png_chunks(data)


def test_png_with_a_corrupt_critical_chunk_is_rejected():
    data = bytearray(_png())
    idat = data.index(b"IDAT")
    data[idat + 10] ^= 0xFF
    with pytest.raises(ImageError, match="bad checksum in a IDAT chunk"):
        check_png_chunks(bytes(data))


def test_intact_png_passes():
    check_png_chunks(_png())
    check_png_chunks(_png() + b"trailing bytes after IEND are ignored")


@pytest.mark.parametrize("name", [b"t$XT", b"\x00\x01\x00\x00", b"fd\xe1T"])
def test_png_chunk_named_by_other_than_letters_is_rejected_like_tensorflow_does(name):
    import struct
    import zlib

    import tensorflow as tf

    data = _png()
    body = b"payload"
    chunk = struct.pack(">I", len(body)) + name + body + struct.pack(">I", zlib.crc32(name + body))
    iend = data.rindex(b"IEND") - 4
    damaged = data[:iend] + chunk + data[iend:]  # a well-formed chunk with a CRC, badly named
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(damaged, expand_animations=False)
    with pytest.raises(ImageError, match="invalid chunk type"):
        check_png_chunks(damaged)
