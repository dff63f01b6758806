"""The class index: class names -> ids (pure).

In: the set of class names found in the data (or a label map). Out: ClassIndex, the sorted
names from `offset` (0 for Keras/slim, 1 for inception/ODAPI), or integer labels as their own ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from transforms.records import ClassIndex

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
        from transforms.failures import USER_ERROR_MARKER  # write imports this module

        raise ValueError(f"{USER_ERROR_MARKER} {e}") from None
