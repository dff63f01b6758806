"""Classes (pure): labels from folder names (an image's relpath -> its (split, class), or why
it has none), the one rule of a class name for every source of labels, and the class index
(class names -> ids: the sorted names from `offset`, 0 for Keras/slim, 1 for inception/ODAPI,
or integer labels as their own ids)."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable

from transforms.failures import USER_ERROR_MARKER
from transforms.records import ClassIndex

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


# Integer labels make labels.txt list every id up to the largest: refuse absurd ranges.
MAX_INTEGER_CLASSES = 1_000_000


def class_index_for(names: Iterable[str], offset: int = 0, label_type: str = "str") -> ClassIndex:
    """The ClassIndex of the class names found in the data.

    'str': ids are the sorted names from `offset`. 'int': every name is a non-negative
    integer used as its own id; `names` of the index then run from min(offset, smallest id)
    to the largest id, so labels.txt line i is still the class of id i + offset. 'auto' is
    'int' when every name is a canonical integer ('0', '17', not '007'), else 'str'.
    ValueError: 'int' with a non-integer name, or ids beyond MAX_INTEGER_CLASSES.
    """
    names = sorted(set(names))
    as_int = label_type == "int" or (
        label_type == "auto"
        and bool(names)
        and all(n.isascii() and n.isdigit() and str(int(n)) == n for n in names)
    )
    if not as_int or not names:
        return ClassIndex(tuple(names), offset)
    try:
        ids = sorted({int(n) for n in names})
    except ValueError:
        raise ValueError(f"integer labels expected, got {names[:3]}") from None
    low = min(offset, ids[0])
    if ids[-1] - low + 1 > MAX_INTEGER_CLASSES:
        raise ValueError(
            f"integer label {ids[-1]} would make {ids[-1] - low + 1} classes; pass --label_type str"
        )
    return ClassIndex(tuple(str(i) for i in range(low, ids[-1] + 1)), low)


def _index_or_user_error(names: list[str], offset: int, label_type: str) -> ClassIndex:
    try:
        return class_index_for(names, offset, label_type)
    except ValueError as e:
        raise ValueError(f"{USER_ERROR_MARKER} {e}") from None
