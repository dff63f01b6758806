"""An image's annotations made ready to write (pure). In: the record's Objects (transforms/objects.py:
boxes in the annotation's pixels or fractions, as the file gave them), the Geometry the pixels went
through (images/geometry.py), the class index and the settings. Out: PreparedObjects (boxes
normalised by the written image, class ids, flags, area, PNG masks and class map) with counts of
what was clipped or dropped, or an ObjectError naming why the image fails.

The rules (docs/detection.md):
- Boxes are in the stored image's pixels (the frame TensorFlow decodes without EXIF), checked
  against its real size from the header. An annotation that declares another size fails the image
  unless `trust_size` says which to trust: 'image' (its boxes are the image's pixels), or
  'annotation' (its boxes are in the declared frame: the EXIF-upright image when the declared size
  is the upright one, else a copy of the image at the declared size, scaled to it).
- Invalid boxes (NaN, inverted, empty, reaching outside the image) follow `invalid_boxes`: 'fail'
  the image, 'clip' what reaches outside (and drop what is still invalid), or 'drop' them; a clip or
  drop is counted by kind. Boxes within CLAMP_PIXELS of an edge are clamped silently.
- The Geometry maps every box, mask and class map; what a crop cuts is clipped ('crop' counted) and
  what it cuts away whole is dropped ('cropped_out').
- `area` is in the written image's pixels: the annotation's area scaled by the geometry, or
  (absent, or cut by a crop) the mask's pixels, else the box's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from PIL import Image

from transforms.images.geometry import (
    TRANSPOSITIONS,
    Geometry,
    exif_orientation,
    oriented_size,
    unorient_boxes,
)
from transforms.images.masks import IGNORE_CLASS, png_bytes, rasterize, read_class_map
from transforms.images.types import ImageError
from transforms.objects import Objects
from transforms.records import ClassIndex

INVALID_BOX_POLICIES = ("fail", "clip", "drop")
TRUST_SIZE = ("fail", "image", "annotation")
OBJECTS_STAGE = "annotations"  # the stage of an image that fails on its annotations
# A box edge this close outside the image (float noise of fractions, 1-based corners) is clamped.
CLAMP_PIXELS = 0.01
# Kinds of invalid boxes, in the order they are checked (summary.json counts them by these names).
INVALID_KINDS = ("nan", "inverted", "empty", "outside")
# Inverse of each EXIF transposition (rotations by 90 degrees swap; the others are their own).
_INVERSE = {6: TRANSPOSITIONS[8], 8: TRANSPOSITIONS[6]}


class ObjectError(ValueError):
    """The image's annotations cannot be written as they are; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class PreparedObjects:
    """What is written for one image's objects (n kept objects; arrays of length n).

    boxes: float64 (n, 4) xmin, ymin, xmax, ymax as fractions of the written image, 0 <= min <= max <= 1.
    counts: (name, n) of what was clipped or dropped ('clipped/outside', 'dropped/nan', 'crop',
      'cropped_out', ...).
    masks: PNG bytes a kept object (0/1 at the written size), or None without --masks.
    class_map: PNG bytes of the class map at the written size, or None.
    """

    labels: tuple[str, ...]
    ids: tuple[int, ...]
    boxes: np.ndarray
    area: np.ndarray
    is_crowd: np.ndarray
    difficult: np.ndarray
    truncated: np.ndarray
    masks: tuple[bytes, ...] | None = None
    class_map: bytes | None = None
    counts: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class _Frame:
    """How the annotation's coordinates reach the stored image: its size, and either a scale
    (a resized copy) or an EXIF orientation (annotated upright)."""

    size: tuple[int, int]
    orientation: int = 1

    def to_stored(self, boxes: np.ndarray, stored: tuple[int, int]) -> np.ndarray:
        if self.orientation != 1:
            return unorient_boxes(boxes, *stored, self.orientation)
        if self.size != stored:
            sx, sy = stored[0] / self.size[0], stored[1] / self.size[1]
            return boxes * np.array([sx, sy, sx, sy])
        return boxes

    def raster_to_stored(self, raster: Image.Image, stored: tuple[int, int]) -> Image.Image:
        if self.orientation != 1:
            return raster.transpose(_INVERSE.get(self.orientation, TRANSPOSITIONS[self.orientation]))
        if self.size != stored:
            return raster.resize(stored, Image.Resampling.NEAREST)
        return raster

    def area_scale(self, stored: tuple[int, int]) -> float:
        if self.orientation != 1 or self.size == stored:
            return 1.0
        return stored[0] * stored[1] / (self.size[0] * self.size[1])


def _frame(objects: Objects, stored: tuple[int, int], trust_size: str, data: bytes) -> _Frame:
    """The annotation's frame, from its declared size and `trust_size` (module docstring)."""
    declared = objects.declared_size
    if declared is None or declared == stored or trust_size == "image":
        return _Frame(stored)
    orientation = exif_orientation(data)
    upright = oriented_size(*stored, orientation)
    if trust_size == "annotation":
        if orientation in TRANSPOSITIONS and declared == upright:
            return _Frame(declared, orientation)
        if min(declared) <= 0:
            raise ObjectError(f"the annotation declares the size {declared[0]}x{declared[1]}")
        return _Frame(declared)
    why = ""
    if orientation in TRANSPOSITIONS and declared == upright:
        why = (
            f" (its EXIF orientation {orientation} shows it as {upright[0]}x{upright[1]}: annotated upright)"
        )
    raise ObjectError(
        f"the annotation declares {declared[0]}x{declared[1]} but the image is {stored[0]}x{stored[1]}{why}; "
        "--trust_size image or --trust_size annotation says which to follow"
    )


def _invalid_kinds(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """Per box the index in INVALID_KINDS of its first problem, or -1 (valid)."""
    kinds = np.full(len(boxes), -1)
    x0, y0, x1, y1 = boxes.T
    for i, bad in reversed(
        list(
            enumerate(
                (
                    ~np.isfinite(boxes).all(axis=1),
                    (x0 > x1) | (y0 > y1),
                    (x0 == x1) | (y0 == y1),
                    (x0 < 0) | (y0 < 0) | (x1 > width) | (y1 > height),
                )
            )
        )
    ):
        kinds[bad] = i
    return kinds


def _clamp_near_edges(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """Edges within CLAMP_PIXELS outside the image moved onto it (NaN stays NaN)."""
    low = np.array([0.0, 0.0, 0.0, 0.0])
    high = np.array([width, height, width, height], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        near_low = (boxes < low) & (boxes >= low - CLAMP_PIXELS)
        near_high = (boxes > high) & (boxes <= high + CLAMP_PIXELS)
    return np.where(near_low, low, np.where(near_high, high, boxes))


def _check_boxes(
    boxes: np.ndarray, width: int, height: int, policy: str
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(boxes, kept mask, counts) after `policy` (fail | clip | drop). Raises ObjectError (fail)."""
    boxes = _clamp_near_edges(boxes, width, height)
    kinds = _invalid_kinds(boxes, width, height)
    counts: dict[str, int] = {}
    if not (kinds >= 0).any():
        return boxes, np.ones(len(boxes), bool), counts
    if policy == "fail":
        i = int(np.flatnonzero(kinds >= 0)[0])
        box = ", ".join(f"{v:g}" for v in boxes[i])
        raise ObjectError(
            f"object {i}: invalid box [{box}] ({INVALID_KINDS[kinds[i]]}) in an image of {width}x{height}; "
            "--invalid_boxes clip or drop"
        )
    keep = kinds < 0
    if policy == "clip":
        outside = kinds == INVALID_KINDS.index("outside")
        clipped = np.clip(boxes, 0, [width, height, width, height])
        still = _invalid_kinds(clipped, width, height)
        fixed = outside & (still < 0)
        boxes = np.where(fixed[:, None], clipped, boxes)
        keep |= fixed
        if fixed.any():
            counts["clipped/outside"] = int(fixed.sum())
        kinds = np.where(outside & ~fixed, INVALID_KINDS.index("outside"), kinds)
    for i, name in enumerate(INVALID_KINDS):
        n = int(((kinds == i) & ~keep).sum())
        if n:
            counts[f"dropped/{name}"] = n
    return boxes, keep, counts


def prepare_objects(
    objects: Objects,
    geometry: Geometry,
    class_index: ClassIndex,
    *,
    invalid_boxes: str = "fail",
    trust_size: str = "fail",
    masks: bool = False,
    data: bytes = b"",
    read: Callable[[str], bytes] | None = None,
) -> PreparedObjects:
    """The written form of `objects` on an image that went through `geometry` (module docstring).

    `data`: the image's original bytes (its EXIF orientation, read only when a declared size
    differs); `read`: reads the class map at `objects.segmentation_path`.
    Raises ObjectError: an unknown category, an invalid box under 'fail', a declared size the
    image does not have, a mask or class map that does not fit the image.
    """
    stored = geometry.source
    try:
        ids = [class_index.id_of(name) for name in objects.labels]
    except KeyError as e:
        raise ObjectError(f"category {e.args[0]!r} is not in the class index") from None
    frame = _frame(objects, stored, trust_size, data)
    boxes = objects.boxes * np.array([*frame.size, *frame.size]) if objects.normalized else objects.boxes
    boxes, keep, counts = _check_boxes(frame.to_stored(boxes, stored), *stored, invalid_boxes)
    mapped = geometry.map_boxes(boxes)
    width, height = geometry.size
    if geometry.crops:
        inside = np.clip(mapped, 0, [width, height, width, height])
        cut = keep & (inside != mapped).any(axis=1)
        gone = keep & ((inside[:, 2] - inside[:, 0] <= 0) | (inside[:, 3] - inside[:, 1] <= 0))
        if (cut & ~gone).any():
            counts["crop"] = int((cut & ~gone).sum())
        if gone.any():
            counts["cropped_out"] = int(gone.sum())
        keep &= ~gone
        mapped = inside
    else:  # float noise of the mapping: the box is inside the written image
        cut = np.zeros(len(mapped), bool)
        mapped = np.clip(mapped, 0, [width, height, width, height])
    index = np.flatnonzero(keep)
    kept = objects.take(index)
    mapped, cut = mapped[index], cut[index]
    sx, sy = geometry.scale
    area = kept.area * (frame.area_scale(stored) * sx * sy)
    rasters = None
    if masks:
        rasters = [_mask(kept, i, frame, geometry) for i in range(len(kept))]
        counted = np.array([np.count_nonzero(np.asarray(r)) for r in rasters], dtype=np.float64)
        area = np.where(np.isnan(area) | cut, counted, area)
    box_area = (mapped[:, 2] - mapped[:, 0]) * (mapped[:, 3] - mapped[:, 1])
    area = np.where(np.isnan(area) | cut, box_area, area)
    class_map = None
    if objects.segmentation_path is not None:
        class_map = _class_map(objects.segmentation_path, geometry, read)
    normalized = np.clip(mapped / np.array([width, height, width, height], dtype=np.float64), 0.0, 1.0)
    return PreparedObjects(
        labels=kept.labels,
        ids=tuple(ids[i] for i in index.tolist()),
        boxes=normalized,
        area=area,
        is_crowd=kept.is_crowd,
        difficult=kept.difficult,
        truncated=kept.truncated,
        masks=None if rasters is None else tuple(png_bytes(r) for r in rasters),
        class_map=class_map,
        counts=tuple(sorted(counts.items())),
    )


def _mask(objects: Objects, i: int, frame: _Frame, geometry: Geometry) -> Image.Image:
    """Object i's mask at the written size (0/1), through the frame and the geometry."""
    segmentation = objects.masks[i]
    if segmentation is None:
        raise ObjectError(
            f"object {i} ({objects.labels[i]!r}) has no mask (--masks needs one for every object)"
        )
    try:
        raster = rasterize(segmentation, *frame.size)
    except ValueError as e:
        raise ObjectError(f"object {i} ({objects.labels[i]!r}): {e}") from None
    return geometry.apply_to_raster(frame.raster_to_stored(raster, geometry.source), fill=0)


def _class_map(path: str, geometry: Geometry, read: Callable[[str], bytes] | None) -> bytes:
    """The class map at `path`, checked against the image's size, at the written size (PNG)."""
    if read is None:
        raise ObjectError("a segmentation map with no reader")
    try:
        raster = read_class_map(read(path))
    except OSError as e:
        raise ObjectError(f"segmentation map {path}: unreadable: {e}") from None
    except ImageError as e:
        raise ObjectError(f"{path}: {e}") from None
    if raster.size != geometry.source:
        w, h = geometry.source
        raise ObjectError(f"segmentation map {path} is {raster.width}x{raster.height}, the image {w}x{h}")
    return png_bytes(geometry.apply_to_raster(raster, fill=IGNORE_CLASS))
