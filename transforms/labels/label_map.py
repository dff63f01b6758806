"""Label maps (pure): class names in id order, or an id,name table such as GLDv2's category CSV.

In: the file named by --label_map. Out: LabelMap (names by id, the first id).
"""

from __future__ import annotations

import csv
import posixpath
import unicodedata

from transforms import gcs
from transforms.labels.folders import class_name_problem
from transforms.labels.rows import _COMPRESSED_SUFFIXES, LabelMap


def load_label_map(path: str, offset: int = 0) -> LabelMap:
    """The classes of --label_map: a file of names, or a table of ids and names.

    - A names file (any name but .csv/.tsv): one class name a line, in id order from
      `offset` (blank lines ignored), as TFDS's `ClassLabel(names_file=...)` reads it.
    - A table (.csv or .tsv, optionally compressed): two columns, an integer id and a name,
      in either order, with or without a header row: e.g. GLDv2's
      `train_label_to_category.csv` (`landmark_id,category`) or Dacon's `category.csv`.
      The ids must run without gaps (from any first id, which becomes the label offset).

    Either way a table label may be a class name or an integer id of the map.

    Raises:
      ValueError: unreadable, empty, not UTF-8, a name or id listed twice, a name that
        cannot be a class name, or a table that is not id,name pairs.
    """
    try:
        with gcs.open_read(path) as f:
            text = f.read().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--label_map {path}: cannot read: {e}") from None
    name = path.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    suffix = posixpath.splitext(name)[1]
    if suffix in (".csv", ".tsv"):
        label_map = _id_name_table(text, "\t" if suffix == ".tsv" else ",", path)
    else:
        names = [unicodedata.normalize("NFC", line.strip()) for line in text.splitlines()]
        label_map = LabelMap(tuple(n for n in names if n), offset)
    if not label_map.names:
        raise ValueError(f"--label_map {path} lists no classes")
    seen: set[str] = set()
    for n in label_map.names:
        if n in seen:
            raise ValueError(f"--label_map {path} lists {n!r} twice")
        problem = class_name_problem(n)
        if problem:
            raise ValueError(f"--label_map {path}: class name {n!r} {problem}")
        seen.add(n)
    return label_map


def _is_id(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _id_name_table(text: str, delimiter: str, path: str) -> LabelMap:
    """A LabelMap from the rows of an id,name (or name,id) table; see load_label_map."""
    rows = [
        [c.strip() for c in r]
        for r in csv.reader(text.splitlines(), delimiter=delimiter)
        if any(map(str.strip, r))
    ]
    for i, r in enumerate(rows):
        if len(r) != 2:
            raise ValueError(
                f"--label_map {path}: row {i + 1} has {len(r)} columns, expected two (id and name)"
            )
    if rows and not (_is_id(rows[0][0]) or _is_id(rows[0][1])):
        rows = rows[1:]  # a header row
    if all(_is_id(r[0]) for r in rows):
        pairs = [(int(r[0]), r[1]) for r in rows]
    elif all(_is_id(r[1]) for r in rows):
        pairs = [(int(r[1]), r[0]) for r in rows]
    else:
        raise ValueError(f"--label_map {path}: no column holds an integer id on every row")
    pairs.sort()
    if not pairs:
        return LabelMap(())
    first = pairs[0][0]
    for i, (class_id, _) in enumerate(pairs):
        if class_id != first + i:
            what = f"id {class_id} is listed twice" if class_id < first + i else f"id {first + i} is missing"
            raise ValueError(f"--label_map {path}: ids must run without gaps from {first}: {what}")
    return LabelMap(tuple(unicodedata.normalize("NFC", n) for _, n in pairs), first)
