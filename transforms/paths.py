"""Paths as the job sees them (local, or any Beam filesystem's URLs): image extensions, roots,
relative paths, literal globs. Pure functions every stage may use."""

from __future__ import annotations

import os
import posixpath
import re

# Matched case-insensitively against the file name's last suffix. `.jfif` and `.jpe` are JPEG
# names (Windows and old cameras save them); HEIC/HEIF and AVIF are read by Pillow where it has
# a decoder for them and converted (transforms/images/check.py), else fail naming the format.
IMAGE_EXTENSIONS = (
    *(".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"),
    *(".psd", ".ico", ".tga", ".avif", ".heic", ".heif"),
)


def has_image_extension(path: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> bool:
    """True if `path` ends in one of `extensions`, ignoring case."""
    return posixpath.splitext(path)[1].lower() in extensions


def normalize_root(root: str) -> str:
    """The input root without a trailing separator; local roots made absolute."""
    if "://" in root:
        return root.rstrip("/")
    return os.path.abspath(root)


def relative_path(path: str, root: str) -> str:
    """`path` relative to `root`, '/'-separated.

    A backslash is a separator only in local Windows paths; elsewhere it is a legal
    character of a file name and kept.
    """
    if os.sep == "\\" and "://" not in path:
        path, root = path.replace("\\", "/"), root.replace("\\", "/")
    return path[len(root) :].lstrip("/")


def escape_glob(path: str) -> str:
    """`path` with Beam's glob metacharacters (`*`, `?`, `[`) made literal.

    Beam's patterns cannot quote, but a one-character class can: `[[]`, `[*]`, `[?]`.
    """
    return re.sub(r"([*?[])", r"[\1]", path)


# Separates a listed path from what pins it to the listing (an archive member's header
# checksum, generation, copy: transforms/listing/members.py). No path holds a NUL.
PIN = "\0"


def listed_name(path: str) -> str:
    """`path` as it is shown (failures, `image/filename`): without its pin, the same every run."""
    return path.partition(PIN)[0]
