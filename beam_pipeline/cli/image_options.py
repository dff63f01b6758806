"""The image-handling and schema flags of ConvertOptions, and the EncodeSettings they make.

Kept apart from options.py so that the flags, their checks and their translation into
EncodeSettings live in one place; ConvertOptions adds them with `add_image_arguments`.
"""

from __future__ import annotations

import re

from transforms.encoding.encoder import EncodeSettings
from transforms.encoding.schema import DEFAULT_SCHEMA, PRESETS, get_schema, parse_renames
from transforms.images.types import COLORS, DEFAULT_JPEG_QUALITY, IMAGE_FORMATS, RESIZE_MODES, STORES


def add_image_arguments(group) -> None:
    """Adds the image and schema flags to ConvertOptions' parser (in the group given)."""
    group.add_argument(
        "--image_format",
        choices=IMAGE_FORMATS,
        default="keep",
        help="keep: the file's bytes if TensorFlow decodes them, else PNG.",
    )
    group.add_argument(
        "--jpeg_quality",
        type=int,
        default=DEFAULT_JPEG_QUALITY,
        metavar="Q",
        help="Of re-encoded JPEGs (1-100).",
    )
    group.add_argument("--resize", default="", metavar="WxH", help="Exact size of every image.")
    group.add_argument(
        "--max_side", type=int, default=0, metavar="N", help="Longer side at most N (0: as is)."
    )
    group.add_argument(
        "--resize_mode",
        choices=RESIZE_MODES,
        default="pad",
        help="--resize: fit with black bands, cover and crop, or stretch.",
    )
    group.add_argument("--color", choices=COLORS, default="keep", help="rgb: 3 channels; grayscale: 1.")
    group.add_argument("--exif_transpose", action="store_true", help="Apply the EXIF orientation.")
    group.add_argument("--store", choices=STORES, default="encoded", help="raw: uint8 pixels (HWC).")
    group.add_argument(
        "--schema", choices=sorted(PRESETS), default=DEFAULT_SCHEMA, help="Feature keys preset."
    )
    group.add_argument(
        "--rename_keys", default="", metavar="SPEC", help="Key renames on top of --schema: old=new,..."
    )


def parse_size(spec: str) -> tuple[int, int] | None:
    """Parses 'WxH' into (width, height). Raises ValueError."""
    if not spec:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
    if not match or int(match[1]) <= 0 or int(match[2]) <= 0:
        raise ValueError(f"--resize: expected WxH with positive sizes, got {spec!r}")
    return int(match[1]), int(match[2])


def encode_settings(opts) -> EncodeSettings:
    """The EncodeSettings of parsed ConvertOptions. Raises ValueError for bad values."""
    if not 1 <= opts.jpeg_quality <= 100:
        raise ValueError("--jpeg_quality must be between 1 and 100")
    if opts.max_side < 0:
        raise ValueError("--max_side must be positive")
    resize = parse_size(opts.resize)
    if resize and opts.max_side:
        raise ValueError("--resize and --max_side exclude each other")
    renames = parse_renames(opts.rename_keys)
    schema = get_schema(opts.schema, renames)  # checks the renames
    if opts.store == "raw" and not schema.raw_ok:
        raise ValueError(f"--store raw: readers of the {opts.schema} schema expect encoded images")
    if schema.label_offset is not None and opts.label_offset > schema.label_offset:
        raise ValueError(f"--schema {opts.schema} needs class ids from {schema.label_offset}")
    return EncodeSettings(
        max_pixels=opts.max_pixels,
        image_format=opts.image_format,
        jpeg_quality=opts.jpeg_quality,
        resize=resize,
        max_side=opts.max_side,
        resize_mode=opts.resize_mode,
        color=opts.color,
        exif_transpose=opts.exif_transpose,
        store=opts.store,
        single_frame=schema.single_frame,
        schema=opts.schema,
        rename_keys=renames,
    )


def label_offset(opts) -> int:
    """The id of the first class: fixed by presets whose consumer needs it (odapi: 1)."""
    schema = PRESETS[opts.schema]
    return opts.label_offset if schema.label_offset is None else schema.label_offset
