"""The stages' settings from parsed convert options: plain records (TableSpec, JoinSettings,
EncodeSettings, the first class id) that build_pipeline takes, so the graph needs no argparse."""

from __future__ import annotations

import re

from transforms.encoding.encoder import EncodeSettings
from transforms.encoding.schema import PRESETS, get_schema, parse_renames
from transforms.labels.beam_table import WEBDATASET
from transforms.labels.rows import JoinSettings, TableSpec
from transforms.labels.table import detect_format, parse_extra_columns


def table_spec(opts) -> TableSpec:
    """The labels table described by the options (call after validate)."""
    webdataset = opts.labels_path == WEBDATASET
    return TableSpec(
        path=opts.labels_path,
        format=WEBDATASET if webdataset else detect_format(opts.labels_path, opts.labels_format),
        key_column=opts.key_column,
        label_column=opts.label_column,
        separator=opts.label_separator,
        split_column=opts.split_column,
        extra_columns=parse_extra_columns(opts.extra_columns),
        encoding=opts.labels_encoding,
        delimiter=opts.labels_delimiter,
    )


def join_settings(opts) -> JoinSettings:
    """How table rows label images (--label_map's names reach the join as a side input)."""
    return JoinSettings(
        unlabeled=opts.unlabeled,
        duplicates=opts.duplicate_keys,
        label_type="str" if opts.label_map else opts.label_type,
        split_from_folders=opts.splits == "folders",
    )


def encode_settings(opts) -> EncodeSettings:
    """The EncodeSettings of parsed ConvertOptions. Raises ValueError for bad values."""
    if not 1 <= opts.jpeg_quality <= 100:
        raise ValueError("--jpeg_quality must be between 1 and 100")
    if opts.max_side < 0:
        raise ValueError("--max_side must be positive")
    resize = None
    if opts.resize:  # WxH
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", opts.resize)
        if not match or int(match[1]) <= 0 or int(match[2]) <= 0:
            raise ValueError(f"--resize: expected WxH with positive sizes, got {opts.resize!r}")
        resize = int(match[1]), int(match[2])
    if resize and opts.max_side:
        raise ValueError("--resize and --max_side exclude each other")
    renames = parse_renames(opts.rename_keys)
    schema = get_schema(opts.schema, renames)  # checks the renames
    if opts.store == "raw" and not schema.raw_ok:
        raise ValueError(f"--store raw: readers of the {opts.schema} schema expect encoded images")
    if schema.label_offset is not None and opts.label_offset > schema.label_offset:
        raise ValueError(f"--schema {opts.schema} needs class ids from {schema.label_offset}")
    as_given = ("max_pixels", "image_format", "jpeg_quality", "max_side", "resize_mode", "color", "store")
    return EncodeSettings(
        **{name: getattr(opts, name) for name in as_given},
        invalid_boxes=getattr(opts, "invalid_boxes", "fail"),
        trust_size=getattr(opts, "trust_size", "fail"),
        masks=bool(getattr(opts, "masks", False)),
        exif_transpose=opts.exif_transpose,
        resize=resize,
        single_frame=schema.single_frame,
        schema=opts.schema,
        rename_keys=renames,
    )


def label_offset(opts) -> int:
    """The id of the first class: fixed by presets whose consumer needs it (odapi: 1)."""
    schema = PRESETS[opts.schema]
    return opts.label_offset if schema.label_offset is None else schema.label_offset
