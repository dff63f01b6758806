"""YOLO label files as annotation rows (pure), and the class names of `--label_map`.

In: `.txt` files, one per image with the image's stem (`images/a.jpg` <-> `labels/a.txt`),
each line `class cx cy w h`: a class index, then the box centre and size as fractions of the
image (at most MAX_FILE_BYTES a file); and the class names (load_class_names), index i naming
class i. Out: rows (rows.py, `normalized`) keyed by the file's stem, one per line in file
order, the corners (cx - w/2, cy - h/2, cx + w/2, cy + h/2); an image-only row for an empty
file (a background image, as Ultralytics reads one).

A line of other than five fields (a YOLO segmentation polygon, a prediction's confidence),
a field that is not a number, or a class index outside the names is a failure row naming the
file and line; a file that is not UTF-8 is one naming the file.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator

import pyarrow as pa
import yaml

from transforms import gcs
from transforms.labels.annotations.files import rows_of_files, stem_key
from transforms.labels.annotations.rows import AnnotationError, RowBuilder, class_name
from transforms.labels.label_map import load_label_map
from transforms.labels.rows import LabelMap
from transforms.records import BATCH_SIZE

SUFFIX = ".txt"
# A label file is ~30 bytes a box: 16 MB is ~500,000 boxes.
MAX_FILE_BYTES = 16 << 20
# A data.yaml is a few KB; its class names, even for 100,000 classes, a few MB.
MAX_YAML_BYTES = 16 << 20
_YAML_SUFFIXES = (".yaml", ".yml")


def load_class_names(path: str) -> LabelMap:
    """The class names of a YOLO dataset: a YOLO `data.yaml` (`names` as a list, or a mapping
    of indices 0..n-1 to names), or a names file (one a line, `classes.txt`, as --label_map
    reads one). Raises AnnotationError naming the problem."""
    if posixpath.splitext(path.lower())[1] not in _YAML_SUFFIXES:
        try:
            return load_label_map(path, 0)
        except ValueError as e:
            raise AnnotationError(str(e)) from None
    try:
        with gcs.open_read(path) as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise AnnotationError(f"--label_map {path}: cannot read: {e}") from None
    if len(data) > MAX_YAML_BYTES:
        raise AnnotationError(f"--label_map {path}: over {MAX_YAML_BYTES >> 20} MiB, not a data.yaml")
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as e:
        raise AnnotationError(f"--label_map {path}: not YAML: {' '.join(str(e).split())[:200]}") from None
    names = doc.get("names") if isinstance(doc, dict) else None
    if isinstance(names, dict):
        if sorted(names) != list(range(len(names))):
            raise AnnotationError(
                f"--label_map {path}: `names` must map the indices 0..{len(names) - 1} to names"
            )
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not names:
        raise AnnotationError(
            f"--label_map {path}: no `names` list (a YOLO data.yaml names its classes there)"
        )
    checked = []
    for i, text in enumerate(names):
        name, problem = class_name(text)
        if problem:
            raise AnnotationError(f"--label_map {path}: names[{i}]: {problem}")
        checked.append(name)
    if len(set(checked)) != len(checked):
        twice = next(n for n in checked if checked.count(n) > 1)
        raise AnnotationError(f"--label_map {path} lists {twice!r} twice")
    nc = doc.get("nc")
    if nc is not None and nc != len(checked):
        raise AnnotationError(f"--label_map {path}: nc is {nc!r} but `names` lists {len(checked)} classes")
    return LabelMap(tuple(checked), 0)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value - value == 0 else None  # finite


def file_rows(rows: RowBuilder, data: bytes, source: str, names: tuple[str, ...]) -> None:
    """The rows of one YOLO label file's bytes (`source` names it) added to `rows`."""
    key = stem_key(source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return rows.fail(key, 0, "not UTF-8 text", source=source)
    before = len(rows)
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            what = "a polygon (YOLO segmentation) is not read" if len(fields) > 5 else "too few fields"
            rows.fail(
                key,
                number,
                f"line {number}: {len(fields)} fields, not class cx cy w h ({what})",
                source=source,
            )
            continue
        values = [_number(f) for f in fields]
        if None in values:
            rows.fail(key, number, f"line {number}: {line.strip()!r} is not five numbers", source=source)
            continue
        index, cx, cy, w, h = values
        if not index.is_integer() or not 0 <= index < len(names):
            rows.fail(
                key,
                number,
                f"line {number}: class {fields[0]} is not an index of --label_map (0..{len(names) - 1})",
                source=source,
            )
            continue
        rows.add(
            key,
            names[int(index)],
            (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2),
            line=number,
            source=source,
        )
    if len(rows) == before:
        rows.add(key, line=0, source=source)


def yolo_rows(
    paths: Iterable[str], names: tuple[str, ...], size: int = BATCH_SIZE
) -> Iterator[pa.RecordBatch]:
    """The rows of YOLO label files (each read whole, up to MAX_FILE_BYTES), in batches of up
    to `size` rows; `names[i]` is the name of class index i."""

    def parse(rows: RowBuilder, data: bytes, path: str) -> None:
        file_rows(rows, data, path, names)

    return rows_of_files(paths, parse, MAX_FILE_BYTES, normalized=True, key_of=stem_key, size=size)
