"""What the image stage does to an image's coordinates, as one pure description (Geometry), applied
alike to the pixels (convert.py), the boxes, the instance masks and the segmentation map
(encoding/objects.py), so that none can drift from the others.

In: the stored size from the image's header, its EXIF orientation (with --exif_transpose), the
JPEG decoder's scale-down (libjpeg's DCT scaling, chosen by Pillow's `draft`) and ImageOptions
(--resize in each --resize_mode, --max_side). Out: a Geometry, whose steps are, in order:

1. reduce: the pixels are decoded at 1/`reduce` (1, 2, 4, 8): point x of the stored image is
   x / reduce of the reduced one, which is ceil(w / reduce) wide (its last column may hold
   padding: the frame reaches reduce x ceil(w / reduce) stored pixels).
2. orientation: the EXIF transposition (2-8), in the reduced frame (Pillow's `transpose`).
3. window: the region of the oriented image that is resampled (--resize_mode crop cuts it;
   otherwise the whole image), to `resized` pixels.
4. offset: where those pixels sit in the output of `size` (--resize_mode pad: black bands).

The numbers are Pillow's own (ImageOps.pad, ImageOps.fit, Image.resize on the reduced, oriented
image, as the conversion did before this module): tests/images/test_geometry.py checks that
`apply_to_image` gives the bytes ImageOps gives (except where ImageOps.pad rounds a side to 0 and
raises: that side keeps 1 pixel, `_contained`), and that a drawn box lands where `map_boxes` says.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from PIL import Image

from transforms.images.check import DECODE_ERRORS, _orientation, detect_format, pillow_open
from transforms.images.types import DEFAULT_MAX_PIXELS, ImageOptions

# EXIF orientation -> the Pillow transposition that makes the image upright (ImageOps.exif_transpose's).
TRANSPOSITIONS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
SWAPS_AXES = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees


def target_size(width: int, height: int, options: ImageOptions) -> tuple[int, int]:
    """The stored (width, height) of an image of (width, height) after --resize / --max_side."""
    if options.resize:
        return options.resize
    if options.max_side and max(width, height) > options.max_side:
        scale = options.max_side / max(width, height)
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height


def oriented_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) after the EXIF transposition `orientation`."""
    return (height, width) if orientation in SWAPS_AXES else (width, height)


def _orient(
    x: np.ndarray, y: np.ndarray, w: float, h: float, orientation: int
) -> tuple[np.ndarray, np.ndarray]:
    """Points of a w x h frame after Pillow's transposition for EXIF `orientation`."""
    if orientation == 2:
        return w - x, y
    if orientation == 3:
        return w - x, h - y
    if orientation == 4:
        return x, h - y
    if orientation == 5:
        return y, x
    if orientation == 6:
        return h - y, x
    if orientation == 7:
        return h - y, w - x
    if orientation == 8:
        return y, w - x
    return x, y


def _unorient(
    x: np.ndarray, y: np.ndarray, w: float, h: float, orientation: int
) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `_orient`: points of the oriented w x h frame back in the unoriented one."""
    if orientation == 6:
        return y, w - x
    if orientation == 8:
        return h - y, x
    return _orient(x, y, w, h, orientation)  # flips, 180 and the two diagonals are their own inverse


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Stored image -> written image, as the steps of the module docstring.

    Attributes:
      source: (width, height) of the stored image, from its header.
      orientation: the EXIF orientation applied (1: none).
      reduce: the JPEG decode's scale-down factor (1: full size).
      window: (left, top, right, bottom) of the oriented, reduced image that is resampled.
      resized: (width, height) the window is resampled to.
      offset: (x, y) of the resampled pixels in the output.
      size: (width, height) of the written image.
    """

    source: tuple[int, int]
    orientation: int
    reduce: int
    window: tuple[float, float, float, float]
    resized: tuple[int, int]
    offset: tuple[int, int]
    size: tuple[int, int]

    @classmethod
    def identity(cls, width: int, height: int) -> Geometry:
        return cls(
            (width, height),
            1,
            1,
            (0.0, 0.0, float(width), float(height)),
            (width, height),
            (0, 0),
            (width, height),
        )

    @property
    def reduced(self) -> tuple[int, int]:
        """(width, height) of the decoded (reduced) image before its transposition."""
        w, h = self.source
        return -(-w // self.reduce), -(-h // self.reduce)

    @property
    def oriented(self) -> tuple[int, int]:
        """(width, height) of the reduced image after its transposition."""
        return oriented_size(*self.reduced, self.orientation)

    @property
    def is_identity(self) -> bool:
        return self == Geometry.identity(*self.source)

    @property
    def crops(self) -> bool:
        """True when part of the image is cut away (--resize_mode crop), so objects may be cut."""
        return self.window != (0.0, 0.0, *map(float, self.oriented))

    @property
    def scale(self) -> tuple[float, float]:
        """Written pixels per stored pixel along the output's x and y axes."""
        left, top, right, bottom = self.window
        return (
            self.resized[0] / (right - left) / self.reduce,
            self.resized[1] / (bottom - top) / self.reduce,
        )

    def map_points(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points of the stored image (continuous pixel coordinates) in the written image."""
        dw, dh = self.reduced
        u, v = _orient(
            np.asarray(x, np.float64) / self.reduce,
            np.asarray(y, np.float64) / self.reduce,
            dw,
            dh,
            self.orientation,
        )
        left, top, right, bottom = self.window
        return (
            (u - left) * (self.resized[0] / (right - left)) + self.offset[0],
            (v - top) * (self.resized[1] / (bottom - top)) + self.offset[1],
        )

    def map_boxes(self, boxes: np.ndarray) -> np.ndarray:
        """(n, 4) xmin, ymin, xmax, ymax boxes in stored pixels -> the same in written pixels
        (not clipped: a crop can leave part or all of a box outside `size`)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        x0, y0 = self.map_points(boxes[:, 0], boxes[:, 1])
        x1, y1 = self.map_points(boxes[:, 2], boxes[:, 3])
        return np.stack(
            [np.minimum(x0, x1), np.minimum(y0, y1), np.maximum(x0, x1), np.maximum(y0, y1)], axis=1
        )

    def apply_to_image(self, img: Image.Image, resample: int, fill: int | tuple = 0) -> Image.Image:
        """The decoded image (already reduced: Pillow's draft did it) through steps 2-4.
        `resample`: Pillow's filter (BICUBIC for pixels, NEAREST for masks and class maps);
        `fill`: the value of the pad bands."""
        if self.orientation in TRANSPOSITIONS:
            img = img.transpose(TRANSPOSITIONS[self.orientation])
        if img.size != self.oriented:
            raise ValueError(f"image of {img.size} where the geometry expects {self.oriented}")
        whole = (0.0, 0.0, float(img.width), float(img.height))
        if self.resized != img.size or self.window != whole:
            img = img.resize(self.resized, resample, box=None if self.window == whole else self.window)
        if self.resized == self.size:
            return img
        out = Image.new(img.mode, self.size, fill)
        out.paste(img, self.offset)
        return out

    def apply_to_raster(self, raster: Image.Image, fill: int = 0) -> Image.Image:
        """A mask or class map of the stored image's size (full resolution) through every step,
        nearest-neighbour: the pixels outside the stored image (reduce's padding) and the pad
        bands are `fill`."""
        if raster.size != self.source:
            raise ValueError(f"raster of {raster.size} where the image is {self.source}")
        dw, dh = self.reduced
        f = self.reduce
        if f != 1:  # the reduced frame reaches f * ceil(w / f) stored pixels: pad to it
            padded = Image.new(raster.mode, (dw * f, dh * f), fill)
            padded.paste(raster, (0, 0))
            raster = padded
        if self.orientation in TRANSPOSITIONS:
            raster = raster.transpose(TRANSPOSITIONS[self.orientation])
        left, top, right, bottom = self.window
        box = (left * f, top * f, right * f, bottom * f)
        if self.resized != raster.size or box != (0.0, 0.0, float(raster.width), float(raster.height)):
            raster = raster.resize(self.resized, Image.Resampling.NEAREST, box=box)
        if self.resized == self.size:
            return raster
        out = Image.new(raster.mode, self.size, fill)
        out.paste(raster, self.offset)
        return out


def draft_request(width: int, height: int, orientation: int, options: ImageOptions) -> tuple[int, int] | None:
    """The size to ask a JPEG decoder for (Pillow's `draft`, libjpeg's 1/2, 1/4, 1/8 scaling),
    or None when the image is not scaled below half size: never below the size the output needs."""
    ow, oh = oriented_size(width, height, orientation)
    tw, th = target_size(ow, oh, options)
    ratios = (tw / ow, th / oh)  # the larger one sets the decode's scale (the smaller if padded)
    scale = min(ratios) if options.resize and options.resize_mode == "pad" else max(ratios)
    if scale >= 0.5:
        return None
    return math.ceil(width * scale), math.ceil(height * scale)


def plan_geometry(
    width: int, height: int, orientation: int, options: ImageOptions, reduce: int = 1
) -> Geometry:
    """The Geometry of a stored `width` x `height` image with EXIF `orientation` (1 unless
    --exif_transpose), decoded at 1/`reduce`, under `options` (--resize, --resize_mode, --max_side).

    Computed on the reduced, oriented size with Pillow's formulas (ImageOps.contain/pad for pad,
    ImageOps.fit for crop, a plain resize for stretch and --max_side).
    """
    orientation = orientation if orientation in TRANSPOSITIONS else 1
    reduced = -(-width // reduce), -(-height // reduce)
    ow, oh = oriented_size(*reduced, orientation)
    whole = (0.0, 0.0, float(ow), float(oh))
    size = target_size(ow, oh, options)
    resized, window, offset = size, whole, (0, 0)
    if size != (ow, oh) and options.resize and options.resize_mode == "pad":
        resized = _contained((ow, oh), size)
        if resized != size:
            if resized[0] != size[0]:
                offset = (round((size[0] - resized[0]) * 0.5), 0)
            else:
                offset = (0, round((size[1] - resized[1]) * 0.5))
    elif size != (ow, oh) and options.resize and options.resize_mode == "crop":
        window = _fit_window((ow, oh), size)
    return Geometry((width, height), orientation, reduce, window, resized, offset, size)


def _contained(image: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """ImageOps.contain's size: the largest of the image's aspect inside `size`, its short side
    never below 1 pixel. ImageOps.contain rounds a 3x1000 image into 100x100 to 0x100 and Pillow
    refuses to resize to it (ValueError; Pillow issue 9997): the image's 1-pixel-wide content is
    what a padded training image should hold, as Image.thumbnail and --max_side keep a side at 1."""
    im_ratio, dest_ratio = image[0] / image[1], size[0] / size[1]
    if im_ratio != dest_ratio:
        if im_ratio > dest_ratio:
            new_height = max(1, round(image[1] / image[0] * size[0]))
            if new_height != size[1]:
                return size[0], new_height
        else:
            new_width = max(1, round(image[0] / image[1] * size[1]))
            if new_width != size[0]:
                return new_width, size[1]
    return size


def _fit_window(image: tuple[int, int], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """ImageOps.fit's crop box (no bleed, centred): the largest window of `size`'s aspect."""
    live_ratio, output_ratio = image[0] / image[1], size[0] / size[1]
    if live_ratio == output_ratio:
        crop_width, crop_height = image[0], image[1]
    elif live_ratio >= output_ratio:
        crop_width, crop_height = output_ratio * image[1], image[1]
    else:
        crop_width, crop_height = image[0], image[0] / output_ratio
    left = 0.0 + (image[0] - crop_width) * 0.5
    top = 0.0 + (image[1] - crop_height) * 0.5
    return (left, top, left + crop_width, top + crop_height)


def unorient_boxes(boxes: np.ndarray, width: int, height: int, orientation: int) -> np.ndarray:
    """Boxes of the upright (EXIF-applied) frame of a stored `width` x `height` image, in the
    stored frame (annotations made on the displayed image: --trust_size annotation)."""
    ow, oh = oriented_size(width, height, orientation)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    x0, y0 = _unorient(boxes[:, 0], boxes[:, 1], ow, oh, orientation)
    x1, y1 = _unorient(boxes[:, 2], boxes[:, 3], ow, oh, orientation)
    return np.stack([np.minimum(x0, x1), np.minimum(y0, y1), np.maximum(x0, x1), np.maximum(y0, y1)], axis=1)


def exif_orientation(data: bytes) -> int:
    """The EXIF orientation of an image's bytes, read from its header (1 if it cannot say)."""
    try:
        return _orientation(pillow_open(data, detect_format(data), DEFAULT_MAX_PIXELS))
    except (*DECODE_ERRORS, Image.UnidentifiedImageError, Image.DecompressionBombError):
        return 1
