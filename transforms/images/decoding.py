"""How a dataset's readers decode its stored images, per stored format and store mode: the one
rule the conversion (convert.py), the reader metadata (output/tfds.py) and `load_dataset`,
`verify`, `inspect` share. TensorFlow is imported only to decode.
"""

from __future__ import annotations

# Formats that TensorFlow 2.21's `decode_image` with its default `expand_animations=True` decodes
# 4-D (frames, H, W, C), single frames too (tests/readers/test_reader_formats.py), as TFDS's
# `Image` and the tf-slim/ODAPI decoders do: they need 3-D images.
DECODED_4D_FORMATS = frozenset({"gif", "webp"})

STORE_ENCODED, STORE_RAW = "encoded", "raw"
# What features.json declares the stored image as (see image_feature_kind).
IMAGE_FEATURE, BYTES_FEATURE, RAW_FEATURE = "image", "bytes", "raw"


def decodes_4d(fmt: str) -> bool:
    """True when `decode_image(expand_animations=True)` gives 4-D for images of format `fmt`."""
    return fmt in DECODED_4D_FORMATS


def image_feature_kind(store: str, formats: set[str] | frozenset[str]) -> str:
    """What TFDS can be told the stored image is: RAW_FEATURE (raw pixels), BYTES_FEATURE when
    some stored format decodes 4-D in TFDS's `Image`, else IMAGE_FEATURE."""
    if store == STORE_RAW:
        return RAW_FEATURE
    if any(decodes_4d(f) for f in formats):
        return BYTES_FEATURE
    return IMAGE_FEATURE


def raw_size(height: int, width: int, channels: int) -> int:
    """Bytes of raw uint8 pixels of that shape."""
    return height * width * channels


def to_channels(image, channels: int):
    """A uint8 (H, W, C) image with C in 1..4 (grey, grey+alpha, RGB, RGBA) as `channels`
    channels, the way `decode_image(channels=...)` converts (alpha dropped, or opaque added;
    grey repeated to RGB; RGB to grey with `rgb_to_grayscale`). 0 keeps the image as it is."""
    import tensorflow as tf

    if channels == 0:
        return image
    have = tf.shape(image)[-1]
    rgb = tf.cond(have < 3, lambda: tf.repeat(image[..., :1], 3, axis=-1), lambda: image[..., :3])
    alpha = tf.cond(
        tf.equal(have % 2, 0),  # LA or RGBA
        lambda: image[..., -1:],
        lambda: tf.fill(tf.concat([tf.shape(image)[:-1], [1]], 0), tf.constant(255, tf.uint8)),
    )
    if channels == 3:
        return rgb
    if channels == 4:
        return tf.concat([rgb, alpha], -1)
    grey = tf.cond(
        have < 3,
        lambda: image[..., :1],
        lambda: tf.cast(tf.round(tf.image.rgb_to_grayscale(tf.cast(rgb, tf.float32))), tf.uint8),
    )
    if channels == 1:
        return grey
    if channels == 2:
        return tf.concat([grey, alpha], -1)
    raise ValueError(f"channels must be 0, 1, 2, 3 or 4, not {channels}")


def decode_stored(data, store: str, shape=None, channels: int = 0):
    """A stored image (`data`: string tensor or bytes) as `load_dataset` decodes it: a uint8
    (H, W, `channels`) tensor (0: as stored); raw pixels are reshaped to `shape` (H, W, C).

    Decoded with the stored channels, then converted by `to_channels`: TensorFlow 2.21's
    `decode_image(channels=...)` refuses many conversions (3 channels of an RGBA WebP,
    4 of a JPEG, 1 of a GIF, WebP or BMP), so asking it would fail on valid records.
    """
    import tensorflow as tf

    if store == STORE_RAW:  # row-major H x W x C bytes
        image = tf.reshape(tf.io.decode_raw(data, tf.uint8), tf.stack([tf.cast(n, tf.int32) for n in shape]))
    else:
        image = tf.io.decode_image(data, channels=0, expand_animations=False)
    return to_channels(image, channels)
