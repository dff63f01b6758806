"""The largest file an image within `--max_pixels` can be, judged from its first bytes.

In: a file's first bytes (`read.HEADER_BYTES`) and its size, before it is read whole. Out:
nothing, or an ImageError for unrecognised content, a header above `--max_pixels`, or a file
larger than any image of its format within the limit (`_BYTES_PER_PIXEL`, all frames counted,
plus `_ANY_IMAGE_BYTES` for EXIF, ICC profiles, previews, a phone's appended video).

Why: the readers read an image whole before decoding it; a multi-GB file named `.jpg` would
end the job with a MemoryError. Only files above `read.CHECK_ABOVE` are checked.
"""

from __future__ import annotations

from PIL import Image

from transforms.images.check import OTHER_SIGNATURES, check_size, detect_format, pillow_open
from transforms.images.types import ImageError

_ANY_IMAGE_BYTES = 64 << 20
# The most bytes a file of each format spends per pixel, with room to spare. JPEG: 4.1
# measured for noise at quality 100 without chroma subsampling, 12 allows 4 components and
# progressive scans. PNG: 16-bit RGBA plus filter bytes and stored deflate blocks. GIF: LZW
# codes of at most 12 bits, each at least one pixel. BMP: 32 bits (RLE8 at worst 2 bytes).
# WebP: lossless RGBA above 4 bytes at worst. TIFF and the rest: 32-bit float RGBA.
_BYTES_PER_PIXEL = {"jpeg": 12.0, "png": 8.1, "gif": 1.6, "bmp": 4.1, "webp": 6.0, "tiff": 16.0}
_OTHER_BYTES_PER_PIXEL = 16.0


def max_file_bytes(fmt: str | None, max_pixels: int) -> int:
    """The largest file of format `fmt` (None: another Pillow format) within `max_pixels`."""
    per_pixel = _BYTES_PER_PIXEL.get(fmt or "", _OTHER_BYTES_PER_PIXEL)
    return int(per_pixel * max_pixels) + _ANY_IMAGE_BYTES


def check_header(header: bytes, size: int, max_pixels: int) -> None:
    """Refuses a `size`-byte file from its first bytes (all of them when it is that short).
    Raises ImageError: unrecognised content, a header above `max_pixels`, or a file larger than
    `max_file_bytes` for its format (the only check for a header Pillow cannot read)."""
    fmt = detect_format(header)
    if fmt is not None or not header.startswith(OTHER_SIGNATURES):
        try:
            img = pillow_open(header, fmt, max_pixels)
        except Exception as e:  # noqa: BLE001 - any failure to read a cut header: not read here
            if isinstance(e, Image.DecompressionBombError):  # far above the limit; refused by Pillow
                raise ImageError(f"too large: more than {max_pixels} pixels ({e})") from None
            if fmt is None:
                raise ImageError("not an image (unrecognised content)") from None
        else:
            fmt = fmt or img.format.lower()
            check_size(*img.size, max_pixels)
    limit = max_file_bytes(fmt, max_pixels)
    if size > limit:
        raise ImageError(
            f"too large: a {size:,}-byte file, more than any {fmt or 'image'} of at most "
            f"{max_pixels:,} pixels can take ({limit:,} bytes)"
        )
