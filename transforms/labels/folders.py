"""Labels from folder names (pure): an image's relpath -> its (split, class) from the folders
above it, or why it has none; and the one rule of a class name, for every source of labels."""

from __future__ import annotations

import functools
import unicodedata

DEFAULT_SPLIT = "train"


def folder_label(relpath: str, split_from_folders: bool) -> tuple[str, str]:
    """(split, class name) read from the folders of `relpath` (ValueError: not in a class folder)."""
    parts = relpath.split("/")
    depth = 3 if split_from_folders else 2
    if len(parts) < depth:
        where = "<split>/<class>/" if split_from_folders else "<class>/"
        raise ValueError(f"not inside a class folder (expected {where}...)")
    for name in parts[: depth - 1]:
        check_folder_name(name)
    if split_from_folders:
        return parts[0], parts[1]
    return DEFAULT_SPLIT, parts[0]


# Characters a class name may not hold: C0 and C1 controls (line breaks, tab, NUL, ...) and the
# Unicode line and paragraph separators, which text readers (str.splitlines) also break at.
_NOT_IN_NAMES = frozenset([*map(chr, range(32)), *map(chr, range(127, 160)), "\u2028", "\u2029"])


def class_name_problem(name: str) -> str | None:
    """Why `name` cannot be a class (or split) name, or None: class names go into labels.txt
    (one a line), summary.json, the TFDS metadata and the records, so they must be UTF-8 text
    without line breaks or other control characters, and without invisible format characters
    (Unicode Cf: a byte order mark, zero-width spaces and joiners, bidi marks), which would make
    a second class that prints exactly like the first."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if not _NOT_IN_NAMES.isdisjoint(name):
        return "contains a control character (line break, tab, ...)"
    if not name.isascii():
        found = next((c for c in name if unicodedata.category(c) == "Cf"), None)
        if found is not None:
            what = unicodedata.name(found, "format character").lower()
            return f"contains an invisible character (U+{ord(found):04X} {what})"
    return None


@functools.lru_cache(maxsize=4096)  # a folder name is checked once, not once per image in it
def check_folder_name(name: str) -> None:
    """ValueError unless a class or split folder name is a valid class name."""
    problem = class_name_problem(name)
    if problem:
        raise ValueError(f"folder name {name!r} {problem}")
