"""Converting one image (pure). In: an image's bytes and ImageOptions. Out: PreparedImage, the
bytes to store (kept when TensorFlow decodes them right and no option changes them, else
re-encoded) with the ImageInfo TensorFlow decodes and the Geometry its pixels went through
(geometry.py: the one description the boxes and masks follow too); and the estimated stored
size for planning.
"""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from transforms.images.check import (
    _MODE_CHANNELS,
    _RESAMPLE,
    _SIXTEEN_BIT,
    _check_as_stored,
    _check_sides,
    _load,
    _open,
    _orientation,
    _tf_channels,
    _tf_problem,
    check_png_chunks,
)
from transforms.images.decoding import decodes_4d
from transforms.images.geometry import draft_request, plan_geometry, target_size
from transforms.images.types import RAW_FORMAT, ImageError, ImageInfo, ImageOptions, PreparedImage


def _needs_change(img: Image.Image, fmt: str, channels: int, options: ImageOptions) -> str | None:
    """Which option makes these (TensorFlow-decodable) bytes need re-encoding, if any."""
    if options.store == "raw":
        return "stored raw"
    if options.image_format not in ("keep", fmt):
        return f"re-encoded as {options.image_format}"
    if target_size(*img.size, options) != img.size:
        return "resized"
    if (options.color == "rgb" and channels != 3) or (options.color == "grayscale" and channels != 1):
        return f"converted to {options.color}"
    if options.exif_transpose and _orientation(img) != 1:
        return "rotated by EXIF orientation"
    if options.single_frame and decodes_4d(fmt):
        return f"{fmt} decodes 4-D with expand_animations=True: first frame kept"
    return None


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit grey -> 8-bit, scaled as TensorFlow does (`>> 8`; Pillow's convert clips)."""
    pixels = np.asarray(img.convert("I"), dtype=np.int64)
    return Image.fromarray((np.clip(pixels, 0, 65535) >> 8).astype(np.uint8), "L")


def _normalize_mode(img: Image.Image, keep_16bit: bool) -> Image.Image:
    """Returns the image in one of L, LA, RGB, RGBA (or I;16 when `keep_16bit`)."""
    mode = img.mode
    if mode in ("L", "LA", "RGB", "RGBA"):
        return img
    if mode == "I" and img.getextrema()[0] >= 0 and img.getextrema()[1] <= 65535:
        mode = "I;16N"  # 16-bit data held in 32-bit integers
    if mode in _SIXTEEN_BIT:
        if not keep_16bit:
            return _to_8bit(img)
        return img if mode == "I;16" else img.convert("I;16")
    if mode == "1":
        return img.convert("L")
    if mode in ("P", "PA"):
        return img.convert("RGBA" if mode == "PA" or "transparency" in img.info else "RGB")
    if mode == "La":
        return img.convert("LA")
    if mode in ("RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
        return img.convert("RGBA" if mode == "RGBa" else "RGB")
    raise ImageError(f"mode {mode} cannot be stored as 8- or 16-bit pixels without loss")


def _apply_color(img: Image.Image, color: str) -> Image.Image:
    if color == "rgb" and img.mode != "RGB":
        return img.convert("RGB")  # alpha is dropped, as decode_image(channels=3) does
    if color == "grayscale" and img.mode != "L":
        return img.convert("L")  # ITU-R 601-2 luma, the weights of tf.image.rgb_to_grayscale
    return img


def _output_format(fmt: str, problem: str | None, options: ImageOptions) -> str:
    """JPEG or PNG. In 'keep' mode, JPEGs changed by an option stay JPEG; the rest is PNG."""
    if options.image_format != "keep":
        return options.image_format
    return "jpeg" if fmt == "jpeg" and problem is None else "png"


def _encode(img: Image.Image, out_fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    if out_fmt == "jpeg":
        if img.mode == "I;16":
            img = _to_8bit(img)
        img = img.convert({"LA": "L", "RGBA": "RGB"}.get(img.mode, img.mode))
        img.save(buf, "JPEG", quality=quality)
    else:
        img.save(buf, "PNG")
    return buf.getvalue()


def _convert(
    img: Image.Image, fmt: str, problem: str | None, reason: str, options: ImageOptions
) -> PreparedImage:
    """Decodes, applies the options through the image's Geometry and re-encodes (or returns raw pixels)."""
    width, height = img.size
    orientation = _orientation(img) if options.exif_transpose else 1
    reduce = 1
    request = draft_request(width, height, orientation, options) if fmt == "jpeg" else None
    if request is not None:  # libjpeg decodes at 1/2, 1/4 or 1/8 scale, never below the needed size
        drafted = img.draft(img.mode, request)
        if drafted is not None:
            reduce = round(width / drafted[1][2])  # Pillow's box: the stored size / its scale
    geometry = plan_geometry(width, height, orientation, options, reduce)
    _load(img, fmt)
    transforms = options.store == "raw" or options.color != "keep" or geometry.size != geometry.oriented
    img = _normalize_mode(img, keep_16bit=not transforms and options.image_format != "jpeg")
    img = geometry.apply_to_image(_apply_color(img, options.color), _RESAMPLE)
    channels = _MODE_CHANNELS[img.mode]
    if options.store == "raw":
        pixels = np.asarray(img, dtype=np.uint8).reshape(img.height, img.width, channels)
        info = ImageInfo(RAW_FORMAT, img.height, img.width, channels)
        return PreparedImage(pixels.tobytes(), info, reason, geometry)
    out_fmt = _output_format(fmt, problem, options)
    _check_sides(out_fmt, img.width, img.height)
    data = _encode(img, out_fmt, options.jpeg_quality)
    if out_fmt == "jpeg":
        channels = {1: 1, 2: 1, 3: 3, 4: 3}[channels]  # alpha dropped
    return PreparedImage(data, ImageInfo(out_fmt, img.height, img.width, channels), reason, geometry)


def prepare_image(data: bytes, options: ImageOptions = ImageOptions()) -> PreparedImage:
    """The bytes to store for `data`: the original ones when TensorFlow decodes them as stored
    (check.py) and no option changes them, else converted.

    Raises:
      ImageError: empty, unrecognised, too large, corrupt, or impossible to store
        without loss; the message says why.
    """
    fmt, img = _open(data, options.max_pixels)
    problem = _tf_problem(fmt, data, img, options.max_pixels)
    change = None if problem else _needs_change(img, fmt, _tf_channels(fmt, data, img), options)
    if problem is None and change is None:
        prepared = PreparedImage(data, _check_as_stored(data, fmt, img))
    else:
        prepared = _convert(img, fmt, problem, problem or change or "converted", options)
    if fmt == "png":
        check_png_chunks(data)  # what Pillow forgives but libpng does not
    return prepared


# Bytes per pixel per channel of a re-encoded image, for shard planning only.
_PNG_RATIO = 0.6  # photos; flat artwork compresses far better
_CROSS_CODEC = 5.0  # at most this many times the source's own bytes per pixel
_JPEG_BITS = {50: 1.0, 75: 1.6, 90: 2.8, 95: 3.8, 100: 8.0}  # bits per pixel, RGB photos


def _jpeg_bytes_per_pixel(quality: int, channels: int) -> float:
    q = min(_JPEG_BITS, key=lambda k: abs(k - quality))
    return _JPEG_BITS[q] / 8 * (1.0 if channels >= 3 else 0.5)


def _converted_channels(img: Image.Image) -> int:
    """Channels of `img` once `_normalize_mode` has converted it."""
    mode = img.mode
    if mode in ("1", "I", "F") or mode in _SIXTEEN_BIT:
        return 1
    if mode == "P":
        return 4 if "transparency" in img.info else 3
    return _MODE_CHANNELS.get(mode, 4 if mode in ("PA", "La", "RGBa") else 3)


def estimate_stored_size(header: bytes, file_size: int, options: ImageOptions) -> int:
    """Estimated bytes stored for an image (to plan shards when options change the pixels),
    from its first bytes and its file size: exact for raw pixels; the source's bytes per pixel
    in the same codec; across codecs a typical photo ratio, at most _CROSS_CODEC times the
    source's (flat artwork compresses well in every codec); `file_size` for an unreadable header.
    """
    try:
        fmt, img = _open(header, options.max_pixels)
        problem = _tf_problem(fmt, header, img)
    except (ImageError, struct.error):
        return file_size
    width, height = img.size
    tw, th = target_size(width, height, options)
    channels = {"rgb": 3, "grayscale": 1}.get(options.color) or _converted_channels(img)
    pixels = tw * th
    if options.store == "raw":
        return pixels * channels
    if problem is None and _needs_change(img, fmt, _tf_channels(fmt, header, img), options) is None:
        return file_size
    scaled = file_size * pixels / (width * height)  # the source's bytes per pixel, kept
    out_fmt = _output_format(fmt, problem, options)
    if out_fmt == fmt == "png":  # PNG size follows the channel count (e.g. --color grayscale)
        return int(scaled * channels / _converted_channels(img)) + 1
    if out_fmt == fmt:
        return int(scaled) + 1
    # Another codec: a typical photo ratio, bounded by how well the source itself compressed.
    if out_fmt == "jpeg":
        typical = pixels * _jpeg_bytes_per_pixel(options.jpeg_quality, channels)
    else:
        typical = pixels * channels * _PNG_RATIO
    return int(min(typical, _CROSS_CODEC * scaled)) + 1
