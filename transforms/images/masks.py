"""Instance masks and class maps as rasters (pure). In: a COCO `segmentation` (polygons or RLE, as
JSON text: transforms/objects.py Objects.masks) and a frame size, or a PNG class map's bytes. Out:
uint8 rasters (Pillow 'L' images: a mask 0/1, a map class ids) that the image's Geometry then
resamples nearest-neighbour (geometry.py `apply_to_raster`), and PNG bytes of them.

Polygons and RLE are rasterised by pycocotools, as COCO's own tools and the Model Garden's
converter do, so a mask holds the pixels COCO's evaluation counts.
"""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from transforms.images.check import DECODE_ERRORS
from transforms.images.types import ImageError

# A class map's value for "not labelled" (Pascal VOC, DeepLab): also what pad bands get.
IGNORE_CLASS = 255


def rasterize(segmentation: bytes, width: int, height: int) -> Image.Image:
    """A COCO segmentation (JSON text of polygons [[x, y, ...], ...], an uncompressed RLE
    {"size": [h, w], "counts": [...]}, or a compressed one {"size", "counts": "..."}) as a 0/1
    'L' image of `width` x `height`. Raises ValueError: not a COCO segmentation, or an RLE of
    another size."""
    from pycocotools import mask as coco_mask  # imported on the first mask, not with the module

    try:
        value = json.loads(segmentation)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("mask is not JSON text") from None
    if isinstance(value, list):
        polygons = [p for p in value if isinstance(p, list)]
        if len(polygons) != len(value) or any(len(p) < 6 or len(p) % 2 for p in polygons):
            raise ValueError("mask polygons must be lists of at least 3 x, y pairs")
        try:
            rle = coco_mask.merge(
                coco_mask.frPyObjects([[float(v) for v in p] for p in polygons], height, width)
            )
        except (TypeError, ValueError):
            raise ValueError("mask polygons must hold numbers") from None
    elif isinstance(value, dict) and isinstance(value.get("counts"), (list, str)) and "size" in value:
        size = value["size"]
        if list(size) != [height, width]:
            raise ValueError(f"mask RLE of size {size[1]}x{size[0]} on an image of {width}x{height}")
        counts = value["counts"]
        if isinstance(counts, list):
            rle = coco_mask.frPyObjects(value, height, width)
        else:
            rle = {"size": [height, width], "counts": counts.encode("ascii")}
    else:
        raise ValueError("mask is neither COCO polygons nor RLE")
    try:
        pixels = coco_mask.decode(rle)
    except (TypeError, ValueError) as e:
        raise ValueError(f"mask RLE does not decode ({e})") from None
    return Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "L")


def read_class_map(data: bytes) -> Image.Image:
    """A PNG class map (grayscale or palette: each value a class id, 255 = ignore) as an 'L'
    image of its class ids. Raises ImageError: not a PNG class map."""
    try:
        img = Image.open(io.BytesIO(data), formats=("PNG",))
        img.load()
    except (*DECODE_ERRORS, Image.UnidentifiedImageError) as e:
        raise ImageError(f"segmentation map does not decode as PNG ({e})") from None
    if img.mode == "P":  # palette indices are the class ids (Pascal VOC's maps)
        return Image.fromarray(np.asarray(img, dtype=np.uint8), "L")
    if img.mode in ("L", "1"):
        return img.convert("L")
    if img.mode in ("I", "I;16", "I;16B", "I;16L"):
        values = np.asarray(img)
        if values.min() < 0 or values.max() > 255:
            raise ImageError("segmentation map holds class ids above 255")
        return Image.fromarray(values.astype(np.uint8), "L")
    raise ImageError(f"segmentation map is a {img.mode} PNG, not grayscale or palette class ids")


def png_bytes(raster: Image.Image) -> bytes:
    """A raster as PNG (what `image/object/mask` and `image/segmentation/class/encoded` hold)."""
    buf = io.BytesIO()
    raster.save(buf, "PNG")
    return buf.getvalue()
