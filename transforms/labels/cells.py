"""A labels table's cells as rows (pure): the rules of keys, labels, splits, extras and header.

In: a block of records' cells (Arrow text columns, table_csv.py) or one record as a dict (JSON
Lines). Out: Arrow batches of rows.ROW_COLUMNS (row_batch) or a LabelRow (parse_row), with each
row's reason if it cannot be used. Columns are checked at once with pyarrow.compute; Python sees
only the keys that are not plain ASCII, and each distinct label, split or extra cell once.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from operator import itemgetter, methodcaller

import pyarrow as pa
import pyarrow.compute as pc

from transforms.labels.folders import class_name_problem
from transforms.labels.rows import (
    _EXTRA_ARROW_TYPES,
    _SPLIT_NAME,
    ERROR,
    EXTRA_PREFIX,
    IMAGE_KEYS,
    KEY,
    LABEL_SEP,
    LABELS,
    LINE,
    SOURCE,
    SPLIT,
    LabelRow,
    TableError,
    TableSpec,
    source_column,
    text_bytes,
)

# The csv module's field size limit (131,072 characters), kept for every format: a longer
# key, label or extra value is refused with the table.
FIELD_LIMIT = 131_072
# Key cells that normalize_key leaves as they are: printable ASCII without backslashes, no
# blank at either end (and not starting with '/' or './'); _KEY_BYTES: the bytes of such keys.
_PLAIN_KEY = r"^[!-\[\]-~]([ -\[\]-~]*[!-\[\]-~])?$"
_KEY_BYTES = bytes(range(33, 127)).replace(b"\\", b"")


def normalize_key(text: str) -> str:
    """A key as both sides of the join see it: NFC Unicode (macOS writes file names
    decomposed, tables are usually composed), invisible format characters (Unicode Cf: a
    byte order mark, zero-width spaces and joiners, bidi marks) taken out, '/'-separated, no
    outer blanks."""
    key = text.strip()
    if not key.isascii():
        key = unicodedata.normalize("NFC", "".join(c for c in key if unicodedata.category(c) != "Cf")).strip()
    key = key.replace("\\", "/")
    while key.startswith("./"):
        key = key[2:]
    return key.lstrip("/")


def image_key(relpath: str, mode: str = "stem") -> str:
    """The join key of an image: its file stem, file name or path relative to the input."""
    return image_keys([relpath], mode)[0]


_LAST_DOT = methodcaller("rpartition", ".")
_LAST_SLASH = methodcaller("rpartition", "/")
_FIRST = itemgetter(0)


def normalize_keys(keys: Sequence[str]) -> list[str]:
    """normalize_key of each key (the keys as they are when the whole column needs no change)."""
    keys = list(keys)
    joined = "\n".join(keys)  # "\n" composes with nothing: one check for the column
    if joined.isascii() and "\\" not in joined and "\n/" not in joined and "\n./" not in joined:
        if not joined.startswith(("/", "./")) and list(map(str.strip, keys)) == keys:
            return keys
    return list(map(normalize_key, keys))


def image_keys(relpaths: Sequence[str], mode: str = "stem") -> list[str]:
    """The join key of each image (its file stem, file name or path relative to the input),
    computed for the column at once."""
    if mode == "relpath":
        return normalize_keys(relpaths)
    if mode not in IMAGE_KEYS:
        raise ValueError(f"--image_key must be one of {', '.join(IMAGE_KEYS)}")
    names = list(map(itemgetter(2), map(_LAST_SLASH, relpaths)))
    if mode == "stem":  # posixpath.splitext: a name's leading dots never start its extension
        heads = map(_FIRST, map(_LAST_DOT, names))
        names = [h if h.lstrip(".") else n for h, n in zip(heads, names)]
    return normalize_keys(names)


def split_labels(value: object, separator: str = "|") -> tuple[str, ...]:
    """The labels of one cell: a JSON list, an int, or text split at `separator`; blank
    parts dropped, repeats removed. ValueError: neither text, an integer nor a list of
    those, or a label that cannot be a class name (folders.class_name_problem)."""
    if value is None:
        return ()
    if isinstance(value, list):
        nested = next((v for v in value if isinstance(v, (list, dict))), None)
        if nested is not None:
            raise ValueError(
                f"label {value!r} holds a list or object inside its list (labels are text or integers)"
            )
        parts = [p for v in value for p in split_labels(v, "")]
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = [str(value)]
    elif isinstance(value, str):
        parts = value.split(separator) if separator else [value]
    else:
        raise ValueError(f"label {value!r} is neither text nor an integer")
    cleaned = (unicodedata.normalize("NFC", p.strip()) for p in parts)
    labels = tuple(dict.fromkeys(p for p in cleaned if p))
    for name in labels:
        problem = class_name_problem(name)
        if problem:
            raise ValueError(f"label {name!r} {problem}")
    return labels


def convert_extra(name: str, kind: str, value: object) -> object:
    """One extra column's value as an int, float or str feature (ValueError: empty, or not of the type)."""
    if value is None or (isinstance(value, str) and not value.strip() and kind != "str"):
        raise ValueError(f"column {name!r} is empty")
    if kind == "str":
        return str(value)
    try:
        if isinstance(value, bool) or (kind == "int" and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        if kind == "int":
            return int(value.strip()) if isinstance(value, str) else int(value)
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"column {name!r}: {value!r} is not {'an int' if kind == 'int' else 'a float'}"
        ) from None


def check_split(cell: str, column: str) -> tuple[str | None, str | None]:
    """(split, None) for a valid split name in `column`, else (None, the reason)."""
    split = unicodedata.normalize("NFC", str(cell).strip())
    if not _SPLIT_NAME.fullmatch(split):
        return None, f"split {split!r} in column {column!r} is not a valid split name"
    return split, None


def parse_row(fields: Mapping[str, object], spec: TableSpec, source: str = "", line: int = 0) -> LabelRow:
    """A LabelRow from one record of the table as a dict; a bad value makes the row's `error`."""
    raw_key = fields.get(spec.key_column)
    key = normalize_key(str(raw_key)) if raw_key is not None and not isinstance(raw_key, (dict, list)) else ""

    def bad(reason: str) -> LabelRow:
        return LabelRow(key=key, source=source, line=line, error=reason)

    if not key:
        return bad(f"no value in key column {spec.key_column!r}")
    missing = [c for c in spec.required_columns() if c not in fields or fields[c] is None]
    missing = [c for c in missing if c != spec.label_column]  # a missing label is "unlabeled"
    if missing:
        return bad(f"no value in column {missing[0]!r}")
    try:
        labels = split_labels(fields.get(spec.label_column), spec.separator)
        extras = tuple((name, convert_extra(name, kind, fields[name])) for name, kind in spec.extra_columns)
    except ValueError as e:
        return bad(str(e))
    split = None
    if spec.split_column:
        split, problem = check_split(fields[spec.split_column], spec.split_column)
        if problem:
            return bad(problem)
    return LabelRow(key=key, labels=labels, split=split, extras=extras, source=source, line=line)


def _plain_keys(cells: pa.Array) -> pa.Array:
    """Per key cell: whether normalize_key leaves it as it is (printable ASCII, no backslash,
    no blank at either end, not starting with '/' or './'); the whole column at once when it
    is all printable ASCII without blanks or backslashes (the usual table)."""
    leading = pc.or_(pc.starts_with(cells, "/"), pc.starts_with(cells, "./"))
    if not text_bytes(cells).translate(None, _KEY_BYTES):
        return pc.invert(leading)
    return pc.and_(pc.match_substring_regex(cells, _PLAIN_KEY), pc.invert(leading))


def _by_distinct(cells: pa.Array, parse) -> tuple[pa.Array, pa.Array | None]:
    """(values, errors or None if there are none) of parse(cell) -> (text, error), called once
    per distinct cell (a label or split column holds few)."""
    coded = cells.dictionary_encode()
    found = [parse(cell) for cell in coded.dictionary.to_pylist()]
    values = pa.array([f[0] for f in found], pa.string()).take(coded.indices)
    if not any(f[1] for f in found):
        return values, None
    return values, pa.array([f[1] for f in found], pa.string()).take(coded.indices)


def row_batch(cells: Mapping[str, pa.Array], lines: pa.Array, spec: TableSpec, source: str) -> pa.RecordBatch:
    """The rows of a block of records: `cells` maps each column the spec needs to its text
    cells, `lines` is each record's line. Rows whose key is empty come out with their error
    (blank records are left out by the reader)."""
    n = len(lines)
    raw = cells[spec.key_column]
    plain = _plain_keys(raw)
    keys = raw
    if not pc.all(plain).as_py():
        other = pc.invert(plain)
        fixed = pa.array(normalize_keys(raw.filter(other).to_pylist()), pa.string())
        keys = pc.replace_with_mask(raw, other, fixed)
    labels, label_errors = _by_distinct(cells[spec.label_column], _label_cell(spec.separator))
    errors = [label_errors]
    if not pc.all(pc.greater(pc.binary_length(keys), 0)).as_py():
        errors.insert(0, pc.if_else(pc.equal(keys, ""), f"no value in key column {spec.key_column!r}", None))
    columns = {}
    for name, kind in spec.extra_columns:  # the values as convert_extra gives them, typed
        values, extra_errors = _by_distinct(cells[name], _extra_cell(name, kind))
        columns[EXTRA_PREFIX + name] = values.cast(_EXTRA_ARROW_TYPES[kind])
        errors.append(extra_errors)
    split = pa.nulls(n, pa.string())
    if spec.split_column:
        column = spec.split_column
        split, split_errors = _by_distinct(cells[column], lambda cell: check_split(cell, column))
        errors.append(split_errors)
    errors = [e for e in errors if e is not None]
    error = pa.nulls(n, pa.string()) if not errors else pc.coalesce(*errors) if len(errors) > 1 else errors[0]
    if error.null_count < n:  # what an invalid row says is its error alone
        usable = error.is_null()
        labels = pc.if_else(usable, labels, "")
        split = pc.if_else(usable, split, pa.scalar(None, pa.string()))
        columns = {name: pc.if_else(usable, c, pa.scalar(None, c.type)) for name, c in columns.items()}
    return pa.RecordBatch.from_pydict(
        {
            KEY: keys.view(pa.binary()),
            LABELS: labels,
            SPLIT: split,
            ERROR: error,
            SOURCE: source_column(source, n),
            LINE: lines,
            **columns,
        },
        schema=spec.schema(),
    )


def _label_cell(separator: str):
    def parse(cell: str) -> tuple[str, str | None]:
        if not cell or (
            cell.isascii() and cell.isprintable() and cell.strip() == cell and separator not in cell
        ):
            return cell, None  # plain text: the label as it is
        try:
            return LABEL_SEP.join(split_labels(cell, separator)), None
        except ValueError as e:
            return "", str(e)

    return parse


def _extra_cell(name: str, kind: str):
    def parse(cell: str) -> tuple[str | None, str | None]:
        try:
            return repr(convert_extra(name, kind, cell)) if kind != "str" else cell, None
        except ValueError as e:
            return None, str(e)

    return parse


def delimiter_hint(header: list[str], spec: TableSpec) -> str:
    """A header read as one column that another delimiter would split: the flag to pass, or ''."""
    hints = {";": "';'", "\t": "a tab", ",": "','", "|": "'|'"}
    flags = {"\t": "--labels_format tsv", ",": "--labels_format csv"}
    for found, name in hints.items():
        if (
            spec.format != "jsonl"
            and len(header) == 1
            and found != spec.csv_delimiter()
            and found in header[0]
        ):
            flag = flags.get(found, f"--labels_delimiter '{found}'")
            return f"its header has no {spec.csv_delimiter()!r} but {name} between names: pass {flag}"
    return ""


def check_header(header: list[str], spec: TableSpec, source: str, what: str = "column") -> None:
    """Raises TableError naming the first required column the header lacks, and the fix."""
    present = [h.strip() for h in header]
    for column in spec.required_columns():
        if column not in present:
            fix = delimiter_hint(header, spec) or _column_fix(column, present, spec)
            raise TableError(
                f"labels table {source} has no {what} {column!r} ({what}s: {', '.join(present[:12])}); {fix}"
            )


def _column_fix(column: str, present: list[str], spec: TableSpec) -> str:
    """Which flag names the missing column, with a column of the table as its likely value."""
    flag = {spec.key_column: "--key_column", spec.label_column: "--label_column"}.get(column)
    if flag is None:
        flag = "--split_column" if column == spec.split_column else "--extra_columns"
        return f"fix {flag}"
    taken = set(spec.required_columns())
    free = [c for c in present if c and c not in taken]
    return f"name the {flag[2:].replace('_', ' ')} with {flag} " + (free[0] if free else "NAME")
