"""Image inspection: detect the format from content and check that the bytes decode.

The check must agree with `tf.io.decode_image(..., expand_animations=False)`: the height,
width and channels returned here are the ones TensorFlow will produce, and an image whose
mode TensorFlow would decode differently is rejected with a reason rather than written.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

from PIL import Image

# Content signatures, checked in order. Extensions are never trusted.
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "png"),
    (b"GIF87a", 0, "gif"),
    (b"GIF89a", 0, "gif"),
    (b"BM", 0, "bmp"),
    (b"WEBP", 8, "webp"),
    (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"),
)

# Formats whose original bytes TensorFlow's decode_image reads.
TF_FORMATS = ("jpeg", "png", "gif", "bmp")

# PIL mode -> channels TensorFlow gives for that format (channels=0).
_TF_CHANNELS: dict[str, dict[str, int]] = {
    "jpeg": {"L": 1, "RGB": 3},
    "png": {"1": 1, "L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "I;16": 1, "I;16B": 1},
    "gif": {"P": 3, "L": 3, "RGB": 3, "RGBA": 3},
    "bmp": {"RGB": 3, "RGBA": 4},
}

# Above this many pixels an image is refused instead of decoded (decompression bombs).
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own bomb threshold (2 * 89,478,485).


class ImageError(ValueError):
    """The bytes are not an image this tool can write; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """What TensorFlow will see when it decodes the stored bytes."""

    format: str
    height: int
    width: int
    channels: int
    colorspace: str


def detect_format(data: bytes) -> str | None:
    """Returns the image format named by the content's signature, or None."""
    for magic, offset, name in _SIGNATURES:
        if data[offset : offset + len(magic)] == magic:
            if name == "webp" and data[:4] != b"RIFF":
                continue
            return name
    return None


def _channels(fmt: str, img: Image.Image) -> int:
    mode = img.mode
    if fmt == "png" and mode == "P":
        return 4 if "transparency" in img.info else 3
    channels = _TF_CHANNELS.get(fmt, {}).get(mode)
    if channels is None:
        raise ImageError(f"unsupported {fmt} mode {mode}")
    return channels


def _colorspace(channels: int) -> str:
    return {1: "Grayscale", 2: "GrayscaleAlpha", 3: "RGB", 4: "RGBA"}[channels]


def inspect_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Checks that `data` decodes and returns its dimensions as TensorFlow sees them.

    The whole image is decoded, so truncated or corrupt data fails here and not at
    training time. JPEGs are decoded at 1/8 scale: that still reads and checks every
    entropy-coded block, at a fraction of the cost of a full decode.

    Raises:
      ImageError: empty, unrecognised, too large, corrupt or of a mode that
        TensorFlow cannot decode as stored.
    """
    if not data:
        raise ImageError("empty file")
    fmt = detect_format(data)
    if fmt is None:
        raise ImageError("not an image (unrecognised content)")
    if fmt not in TF_FORMATS:
        raise ImageError(f"{fmt} is not decodable by TensorFlow")
    try:
        with warnings.catch_warnings():
            # Our own limit below decides; Pillow still raises DecompressionBombError.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise ImageError(f"too large: {width}x{height} exceeds {max_pixels} pixels")
            channels = _channels(fmt, img)
            if fmt == "jpeg":
                img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageError(f"too large: {e}") from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"does not decode as {fmt}: corrupt header") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"does not decode as {fmt}: {e}") from None
    if width <= 0 or height <= 0:
        raise ImageError(f"invalid size {width}x{height}")
    return ImageInfo(fmt, height, width, channels, _colorspace(channels))
