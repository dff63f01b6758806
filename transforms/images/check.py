"""Is it an image, which format, and do TensorFlow's decoders read its bytes as they are.

The guarantee: the bytes written as `image/encoded` decode with
`tf.io.decode_image(..., expand_animations=False)` to exactly the height, width and channels
written next to them. What TensorFlow 2.21 does (tests/images/test_image_modes.py):

- JPEG L/RGB, PNG (every colour type and bit depth; 16-bit is scaled to uint8 by `>> 8`),
  GIF (always 3 channels, first frame), 24-bit BMP and single-frame WebP decode as stored.
- CMYK/YCCK JPEG: TensorFlow's CMYK->RGB differs from other decoders -> PNG.
- GIF: giflib reads every block (gif.py). Damage before the first frame is complete, or a
  first-frame colour index beyond its colour table -> rejected; damage after it, or a later
  frame that does not decode -> PNG of the first frame. The decoded size is the largest frame's.
- BMP other than 24-bit uncompressed: 32-bit gives a 4th channel from the padding byte,
  palette BMPs give palette indices, 1-bit fails -> PNG.
- WebP: animated ones corrupt TensorFlow's heap, and its libwebp refuses containers Pillow
  reads (webp.py) -> PNG of frame 1.
- PNG without IEND or with a bad critical-chunk CRC: Pillow decodes it, libpng refuses it
  (`check_png_chunks`) -> rejected.
- Sides TensorFlow refuses (PNG above 1,000,000, JPEG above JPEG_MAX_SIDE) -> rejected.
- TIFF, PSD, ICO, TGA, PPM, ... (`_FALLBACK_FORMATS`) -> PNG.
- AVIF and HEIC/HEIF (ISO base media files, told by their `ftyp` brands) -> PNG when Pillow
  has a decoder for them (AVIF: Pillow 11.2+; HEIF: the pillow-heif plugin, registered at the
  first HEIF image if it is installed), else a failure naming the format and the fix.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib

from PIL import Image

from transforms.images.gif import gif_layout
from transforms.images.types import DEFAULT_MAX_PIXELS, TF_FORMATS, ImageError, ImageInfo
from transforms.images.webp import webp_problem

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
# The first bytes of formats Pillow identifies without a signature above (PSD, ICO, JPEG 2000,
# SGI): a header cut from a large one is not unknown content (limits.check_header).
OTHER_SIGNATURES = (b"8BPS", b"\x00\x00\x01\x00", b"\x00\x00\x00\x0cjP  ", b"\xff\x4f\xff\x51", b"\x01\xda")
# Pillow plugins tried for content without a signature; all are converted to PNG. A short
# list on purpose: never EPS (Pillow runs Ghostscript on it).
_FALLBACK_FORMATS = ("PSD", "ICO", "TGA", "PPM", "PCX", "SGI", "JPEG2000")
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # by IHDR colour type; palette + tRNS gives 4
_MODE_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "I;16": 1}
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_EXIF_ORIENTATION = 0x0112
_RESAMPLE = Image.Resampling.BICUBIC
# What Pillow raises for bytes it cannot decode (a bug raises anything else).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error)


def detect_format(data: bytes) -> str | None:
    """Returns the image format named by the content's signature, or None."""
    for magic, offset, name in _SIGNATURES:
        if data[offset : offset + len(magic)] == magic:
            if name == "webp" and data[:4] != b"RIFF":
                continue
            return name
    return _media_format(data)


# ISO base media files: the `ftyp` box's brands (major, then compatible) -> format. An AVIF
# may have the major brand `mif1` and `avif` among its compatible ones: AVIF wins.
_BRANDS = {b"avif": "avif", b"avis": "avif"} | dict.fromkeys(
    (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"), "heif"
)
# Formats TensorFlow cannot decode whose Pillow decoder may be missing: (their name, the
# extension their decoder registers, what to do without one).
_PLUGIN_FORMATS = {
    "avif": ("AVIF", ".avif", "Pillow 11.2 or newer reads it"),
    "heif": ("HEIC/HEIF", ".heic", "install the pillow-heif plugin (pip install pillow-heif) to convert it"),
}


def _media_format(data: bytes) -> str | None:
    """'avif' or 'heif' for an ISO base media file with such a brand, else None."""
    if data[4:8] != b"ftyp":
        return None
    end = min(int.from_bytes(data[:4], "big"), len(data), 256)
    brands = {_BRANDS.get(data[i : i + 4]) for i in (8, *range(16, end - 3, 4))}
    return "avif" if "avif" in brands else "heif" if "heif" in brands else None


def _pillow_reads(fmt: str) -> bool:
    """True if Pillow here has a decoder for `fmt` (a key of _PLUGIN_FORMATS). HEIF's plugin is
    registered with Pillow at the first HEIF image, if it is installed (never at import)."""
    extension = _PLUGIN_FORMATS[fmt][1]
    if fmt == "heif" and extension not in Image.registered_extensions():
        try:
            from pillow_heif import register_heif_opener
        except ImportError:
            return False
        register_heif_opener()
    return extension in Image.registered_extensions()


def _png_channels(data: bytes) -> int:
    """Channels TensorFlow decodes a PNG to, from its IHDR colour type and tRNS chunk."""
    color_type = data[25] if len(data) > 25 else -1
    if color_type not in _PNG_CHANNELS:
        raise ImageError(f"does not decode as png: colour type {color_type}")
    if color_type != 3:
        return _PNG_CHANNELS[color_type]
    pos = 8
    while pos + 8 <= len(data):  # tRNS must come before the first IDAT
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"tRNS":
            return 4
        if kind in (b"IDAT", b"IEND"):
            break
        pos += 12 + length
    return 3


def _bmp_problem(data: bytes) -> str | None:
    """Why TensorFlow misreads or refuses a BMP, or None for a 24-bit uncompressed one."""
    if len(data) < 34:
        raise ImageError("does not decode as bmp: truncated header")
    offset, width, height, bits, compression = struct.unpack_from("<I4xii2xHI", data, 10)
    if (bits, compression) != (24, 0):
        return f"{bits}-bit BMP (compression {compression}) is misread by TensorFlow"
    if len(data) != offset + (3 * width + 3) // 4 * 4 * abs(height):  # pixel offset + padded rows
        return "BMP whose file size does not match its header is refused by TensorFlow"
    return None


def _tf_problem(fmt: str, data: bytes, img: Image.Image, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Why TensorFlow 2.21 cannot decode these bytes as they are, or None if it can."""
    if fmt not in TF_FORMATS:
        return f"{fmt} is not decodable by TensorFlow"
    if fmt == "jpeg" and img.mode not in ("L", "RGB"):
        return f"{img.mode} JPEG is decoded with different colours by TensorFlow"
    if fmt == "bmp":
        return _bmp_problem(data)
    if fmt == "webp":
        return webp_problem(data) or (
            "animated WebP crashes TensorFlow's decoder" if _is_animated(img) else None
        )
    if fmt == "gif":
        return _gif_problem(data, img, max_pixels)
    return None


def _tf_channels(fmt: str, data: bytes, img: Image.Image) -> int:
    """Channels `tf.io.decode_image` gives bytes that `_tf_problem` accepts."""
    if fmt == "png":
        return _png_channels(data)
    if fmt == "gif" or fmt == "bmp":
        return 3
    if fmt == "webp":
        return 4 if img.mode == "RGBA" else 3
    return 1 if img.mode == "L" else 3  # jpeg


def _open(data: bytes, max_pixels: int) -> tuple[str, Image.Image]:
    """Detects the format and opens the header; refuses empty, unknown and too large images."""
    if not data:
        raise ImageError("empty file")
    fmt = detect_format(data)
    if fmt in _PLUGIN_FORMATS and not _pillow_reads(fmt):
        name, _, fix = _PLUGIN_FORMATS[fmt]
        raise ImageError(f"{name} image: neither TensorFlow nor Pillow here decodes {name}: {fix}")
    try:
        img = pillow_open(data, fmt, max_pixels)
        fmt = fmt or img.format.lower()
    except Image.UnidentifiedImageError:
        if fmt is None:
            raise ImageError("not an image (unrecognised content)") from None
        raise ImageError(f"does not decode as {fmt}: corrupt header") from None
    except Image.DecompressionBombError as e:  # far above the limit; refused by Pillow itself
        raise ImageError(f"too large: more than {max_pixels} pixels ({e})") from None
    except DECODE_ERRORS:
        raise ImageError(f"does not decode as {fmt or 'an image'}: corrupt header") from None
    check_size(*img.size, max_pixels)
    return fmt, img


def pillow_open(data: bytes, fmt: str | None, max_pixels: int) -> Image.Image:
    """`data` opened by Pillow's reader for `fmt` (None: `_FALLBACK_FORMATS`), header only.

    A `max_pixels` above Pillow's own bomb limit raises that limit and silences its warning
    (our check from the header comes first): set at the first image, never at import, by a
    filter (catch_warnings is not thread-safe)."""
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image.open(io.BytesIO(data), formats=_FALLBACK_FORMATS if fmt is None else (fmt.upper(),))


def check_size(width: int, height: int, max_pixels: int) -> None:
    """Refuses an empty or too large image from its header's size, before any decoding."""
    if width <= 0 or height <= 0:
        raise ImageError(f"invalid size {width}x{height}")
    if width * height > max_pixels:
        raise ImageError(f"too large: {width}x{height} exceeds {max_pixels} pixels")


# libjpeg's JPEG_MAX_DIMENSION (jmorecfg.h: "a tad under 64K to prevent overflows"): the longest
# side libjpeg-turbo encodes (Pillow) or decodes (TensorFlow), below the format's 16-bit 65,535.
# The one JPEG side limit: jpeg.py's walk leaves larger frames to the check here.
JPEG_MAX_SIDE = 65_500
# The longest side TensorFlow's decoders accept (libpng's default user limit, and libjpeg's).
_MAX_SIDE = {"png": 1_000_000, "jpeg": JPEG_MAX_SIDE}


def _check_sides(fmt: str, width: int, height: int) -> None:
    """Refuses a `fmt` image (kept or encoded) with a side longer than TensorFlow decodes."""
    limit = _MAX_SIDE.get(fmt)
    if limit and max(width, height) > limit:
        raise ImageError(
            f"too wide: {width}x{height} has a side over {limit:,} pixels, refused by {fmt} decoders"
        )


def _load(img: Image.Image, fmt: str) -> None:
    try:
        img.load()
    except DECODE_ERRORS as e:
        raise ImageError(f"does not decode as {fmt}: {e}") from None


def _check_as_stored(data: bytes, fmt: str, img: Image.Image) -> ImageInfo:
    """What TensorFlow decodes the bytes to, checked by a whole decode (JPEG at 1/8 scale:
    still every entropy-coded block)."""
    if fmt == "gif":
        return _check_gif(data, img)
    width, height = img.size
    _check_sides(fmt, width, height)
    channels = _tf_channels(fmt, data, img)
    if fmt == "jpeg":
        img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
    _load(img, fmt)
    return ImageInfo(fmt, height, width, channels)


def _check_gif(data: bytes, img: Image.Image) -> ImageInfo:
    """A GIF that passed `_gif_problem`: its first frame's LZW data and colour indices (TensorFlow
    refuses one beyond the colour table, but the transparent one); the largest frame's size."""
    layout = gif_layout(data)
    first = layout.frames[0]
    _load(img, "gif")
    box = (
        first.left,
        first.top,
        min(first.left + first.width, img.width),
        min(first.top + first.height, img.height),
    )
    if img.mode in ("P", "L") and box[0] < box[2] and box[1] < box[3]:
        counts = img.crop(box).histogram()
        beyond = [i for i in range(first.colors, 256) if counts[i] and i != layout.transparent]
        if beyond:
            raise ImageError(
                f"corrupt gif: colour index {beyond[0]} beyond the {first.colors}-entry colour table"
            )
    width, height = layout.size
    return ImageInfo("gif", height, width, 3)


def _gif_problem(data: bytes, img: Image.Image, max_pixels: int) -> str | None:
    """Why a GIF whose first frame decodes is not kept as stored, or None: damage after the
    first frame (gif.py), a later frame that does not decode (giflib decodes all), or a largest
    frame (the size TensorFlow allocates) above the bomb limit. First-frame damage raises."""
    layout = gif_layout(data)
    if _tile_offset(img) != layout.frames[0].offset:
        # Pillow's first frame is not giflib's (an extension whose first sub-block is empty
        # makes giflib read on past its end): what Pillow checks is not what TensorFlow decodes.
        raise ImageError("corrupt gif: an extension block hides the first frame from TensorFlow's reader")
    if layout.damage:
        return f"gif damaged after its first frame ({layout.damage})"
    width, height = layout.size
    if width * height > max_pixels:
        return f"gif frames up to {width}x{height} exceed {max_pixels} pixels"
    try:
        for index in range(1, len(layout.frames)):
            img.seek(index)
            if _tile_offset(img) != layout.frames[index].offset:
                return f"gif frame {index} is read differently by TensorFlow's reader"
            img.load()
    except (*DECODE_ERRORS, IndexError, Image.DecompressionBombError) as e:
        return f"gif frame {index} does not decode ({e or type(e).__name__})"
    finally:
        img.seek(0)
    return None


def _tile_offset(img: Image.Image) -> int | None:
    """Where Pillow reads the current (not yet loaded) GIF frame's LZW data from."""
    return img.tile[0][2] if img.tile else None


def _is_animated(img: Image.Image) -> bool:
    try:
        return bool(getattr(img, "is_animated", False))
    except DECODE_ERRORS:
        return False  # a damaged later frame: only the first one is checked and decoded


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(_EXIF_ORIENTATION, 1))
    except (*DECODE_ERRORS, TypeError):
        return 1  # unreadable EXIF: treat as upright


def check_png_chunks(data: bytes) -> None:
    """Walks the PNG chunks up to IEND as libpng does: each complete and named by four ASCII
    letters, critical ones with a correct CRC (ancillary ones may have a bad one). Raises
    ImageError: the file is cut short or a critical chunk is corrupt."""
    pos = 8  # after the signature
    while True:
        if pos + 12 > len(data):
            raise ImageError("truncated png: the file ends before its IEND chunk")
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise ImageError(f"truncated png: the file ends inside a {kind.decode('latin-1')} chunk")
        if not kind.isalpha():  # libpng: "invalid chunk type" (ASCII letters only)
            raise ImageError(f"corrupt png: invalid chunk type {kind!r}")
        critical = kind[:1].isupper()
        if critical and zlib.crc32(data[pos + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
            raise ImageError(f"corrupt png: bad checksum in a {kind.decode('latin-1')} chunk")
        if kind == b"IEND":
            return
        pos = end
