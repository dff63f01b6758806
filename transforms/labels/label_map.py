"""Label maps (pure): the --label_map file (names in id order, or an id,name table) as a
LabelMap. Lines split at "\\n" only, as TFDS reads a `names_file` (`str.splitlines` would also
break inside a name at U+0085, U+2028..., shifting every later id); a name holding a control
character is refused with its line number."""

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
    - A table (.csv or .tsv, optionally compressed): an integer id and a name, in either
      order, with or without a header (GLDv2's `train_label_to_category.csv`); the ids run
      without gaps from any first id, which becomes the label offset.

    Raises ValueError: unreadable, empty, not UTF-8, a name or id listed twice, a name that
    cannot be a class name (named by its line), or a table that is not id,name pairs.
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
        lines = enumerate(text.split("\n"), 1)
        named = [(number, _name(line, number, path)) for number, line in lines if line.strip()]
        label_map = LabelMap(tuple(n for _, n in named), offset)
    if not label_map.names:
        raise ValueError(f"--label_map {path} lists no classes")
    seen: set[str] = set()
    for n in label_map.names:
        if n in seen:
            raise ValueError(f"--label_map {path} lists {n!r} twice")
        seen.add(n)
    return label_map


def _name(text: str, line: int, path: str) -> str:
    """A class name as written on `line` (spaces stripped, NFC), or ValueError naming the line."""
    name = unicodedata.normalize("NFC", text.strip())
    problem = class_name_problem(name)
    if problem:
        raise ValueError(f"--label_map {path} line {line}: class name {name!r} {problem}")
    return name


def _is_id(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _id_name_table(text: str, delimiter: str, path: str) -> LabelMap:
    """A LabelMap from the rows of an id,name (or name,id) table; see load_label_map."""
    # Each line keeps its "\n": a quoted name that runs over lines holds it, and is refused.
    reader = csv.reader((line + "\n" for line in text.split("\n")), delimiter=delimiter)
    rows = []  # (first line, cells) of each row
    first_line = 1
    try:
        for cells in reader:
            cells = [c.strip() for c in cells]
            if len(cells) != 2 and any(cells):
                raise ValueError(
                    f"--label_map {path} line {first_line} has {len(cells)} columns, expected two "
                    "(id and name)"
                )
            if any(cells):
                rows.append((first_line, cells))
            first_line = reader.line_num + 1
    except csv.Error as e:
        raise ValueError(f"--label_map {path} line {first_line}: {e}") from None
    if rows and not (_is_id(rows[0][1][0]) or _is_id(rows[0][1][1])):
        rows = rows[1:]  # a header row
    if all(_is_id(cells[0]) for _, cells in rows):
        triples = [(int(cells[0]), line, cells[1]) for line, cells in rows]
    elif all(_is_id(cells[1]) for _, cells in rows):
        triples = [(int(cells[1]), line, cells[0]) for line, cells in rows]
    else:
        raise ValueError(f"--label_map {path}: no column holds an integer id on every row")
    triples.sort()
    if not triples:
        return LabelMap(())
    first = triples[0][0]
    for i, (class_id, _, _) in enumerate(triples):
        if class_id != first + i:
            what = f"id {class_id} is listed twice" if class_id < first + i else f"id {first + i} is missing"
            raise ValueError(f"--label_map {path}: ids must run without gaps from {first}: {what}")
    return LabelMap(tuple(_name(name, line, path) for _, line, name in triples), first)
