"""Labels from folder names (pure): one notion of a class folder and a class name.

In: an image's path relative to the input. Out: its (split, class) from the folders above it,
or why it has none. Class names (folders or table labels) holding a line break or another
control character are refused here, for every source of labels.
"""

from __future__ import annotations

import functools

DEFAULT_SPLIT = "train"


def folder_label(relpath: str, split_from_folders: bool) -> tuple[str, str]:
    """Returns (split, class name) read from the folders of `relpath`.

    Raises:
      ValueError: the file is not inside a class folder.
    """
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
    """Why `name` cannot be a class (or split) name, or None if it can.

    Class names go into labels.txt (one a line), summary.json, the TFDS metadata and the
    records: they must be UTF-8 text without line breaks or other control characters. The
    one rule for folder names and for labels read from a table.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if not _NOT_IN_NAMES.isdisjoint(name):
        return "contains a control character (line break, tab, ...)"
    return None


@functools.lru_cache(maxsize=4096)  # a folder name is checked once, not once per image in it
def check_folder_name(name: str) -> None:
    """A class or split folder name must be a valid class name (class_name_problem).

    Raises:
      ValueError: undecodable bytes or a control character such as a line break.
    """
    problem = class_name_problem(name)
    if problem:
        raise ValueError(f"folder name {name!r} {problem}")
