"""What the image stage takes and gives (pure records): ImageOptions (--image_format, --resize,
--color, --store ...) in; PreparedImage (bytes and ImageInfo, as TensorFlow decodes them) or
ImageError (the reason an image fails) out.
"""

from __future__ import annotations

import dataclasses

TF_FORMATS = ("jpeg", "png", "gif", "bmp", "webp")  # what decode_image reads (but see check.py)
IMAGE_FORMATS = ("keep", "jpeg", "png")
RESIZE_MODES = ("pad", "crop", "stretch")
COLORS = ("keep", "rgb", "grayscale")
STORES = ("encoded", "raw")
RAW_FORMAT = "raw"  # `image/format` of records stored with --store raw
# Above this many pixels an image is refused before it is decoded (decompression bombs).
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own bomb threshold (2 * 89,478,485).
DEFAULT_JPEG_QUALITY = 95
_COLORSPACES = {1: "Grayscale", 2: "GrayscaleAlpha", 3: "RGB", 4: "RGBA"}


class ImageError(ValueError):
    """The bytes are not an image this tool can write; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """What TensorFlow will see when it decodes the stored bytes."""

    format: str
    height: int
    width: int
    channels: int

    @property
    def colorspace(self) -> str:
        """The `image/colorspace` name of the channel count."""
        return _COLORSPACES[self.channels]


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How images are checked and (re-)encoded (the CLI's flags of the same names); the
    defaults keep the original bytes.

    Attributes:
      max_pixels: larger images are failures, refused from the header before decoding.
      image_format: 'keep' (the original bytes when TensorFlow reads them), 'jpeg' or 'png'.
      resize: exact (width, height), fitted by `resize_mode` ('pad' with black, 'crop' the
        centre, or 'stretch'); max_side: scale down so that the longer side is at most this.
      color: 'keep', 'rgb' (alpha dropped) or 'grayscale'.
      store: 'encoded' or 'raw' (decoded uint8 pixels, row-major HWC).
      single_frame: store the formats that decode 4-D with `expand_animations=True`
        (decoding.DECODED_4D_FORMATS) as their first frame (PNG), for TFDS and ODAPI.
    """

    max_pixels: int = DEFAULT_MAX_PIXELS
    image_format: str = "keep"
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    resize: tuple[int, int] | None = None
    max_side: int = 0
    resize_mode: str = "pad"
    color: str = "keep"
    exif_transpose: bool = False
    store: str = "encoded"
    single_frame: bool = False

    def changes_pixels(self) -> bool:
        """True if records may differ in size from the source files (re-encoding, raw...)."""
        unchanged = ("encoded", "keep", "keep")
        return bool(self.resize or self.max_side) or (self.store, self.image_format, self.color) != unchanged


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """The bytes to store (original, re-encoded, or raw pixels: `info.format == 'raw'`), what
    TensorFlow decodes them to, why they were converted (None: the original bytes), and the
    Geometry (images/geometry.py) their pixels went through (None: stored as the file holds them)."""

    data: bytes
    info: ImageInfo
    converted: str | None = None
    geometry: object | None = None  # geometry.Geometry (types.py is imported by geometry.py)
