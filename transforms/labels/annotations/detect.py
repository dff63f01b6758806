"""`--labels_format auto` for annotations (pure): which reader a `--labels` path needs.

In: the `--labels` path. Out: an annotation format (rows.ANNOTATION_FORMATS), or None for a
labels table (labels/table.py tells those by their suffix). Bounded: a `.json` file is looked
at in its first SNIFF_BYTES; a folder, glob or gs:// prefix in its first SNIFF_FILES files.

- a `.json` whose top-level object has `images`, `annotations` or `categories` -> coco;
- a folder (glob, prefix) of `.xml` files -> voc; of `.txt` files -> yolo; of `.png` files ->
  segmentation; files of several of these kinds -> ask for --labels_format.
"""

from __future__ import annotations

import os
import posixpath

import ijson

from transforms import gcs
from transforms.labels.annotations import segmentation, voc, yolo
from transforms.labels.annotations.files import list_files
from transforms.labels.annotations.rows import COCO, SEGMENTATION, VOC, YOLO, AnnotationError
from transforms.labels.table import detect_format as table_format

# The head of a .json file read to tell COCO (its first keys come early: info, licenses, images).
SNIFF_BYTES = 1 << 20
# Files of a folder looked at (one listing page on gs://).
SNIFF_FILES = 1000
# The suffix of each folder format's files.
SUFFIXES = {VOC: voc.SUFFIX, YOLO: yolo.SUFFIX, SEGMENTATION: segmentation.SUFFIX}
_FOLDER_FORMATS = {suffix: fmt for fmt, suffix in SUFFIXES.items()}
_COCO_KEYS = ("images", "annotations", "categories")


def top_level_keys(head: bytes) -> list[str] | None:
    """The keys of the top-level JSON object that start within `head`, in order (None: the
    text is not a JSON object)."""
    keys: list[str] = []
    try:
        for prefix, event, value in ijson.parse(head):
            if prefix == "" and event == "map_key":
                keys.append(value)
            elif prefix == "" and event not in ("start_map", "end_map") and not keys:
                return None  # a top-level array or scalar
    except ijson.JSONError:  # the head ends inside the file (or is not JSON: then no key was read)
        return keys or None
    return keys


def is_coco(path: str) -> tuple[bool, str]:
    """(True, '') if `path` starts like a COCO file, else (False, what its top level holds)."""
    try:
        with gcs.open_read(path) as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise AnnotationError(f"--labels {path}: cannot read: {e}") from None
    keys = top_level_keys(head)
    if keys is None:
        return False, "its top level is not a JSON object"
    if any(k in _COCO_KEYS for k in keys):
        return True, ""
    shown = ", ".join(keys[:8]) or "none"
    return False, f"its top-level keys ({shown}) hold none of images, annotations, categories"


def _table_suffix(path: str) -> bool:
    try:
        table_format(path)
    except ValueError:
        return False
    return True


def _is_file(path: str) -> bool:
    """True for a local file, or a gs:// object (not a prefix)."""
    if "://" not in path:
        return os.path.isfile(path)
    return not path.endswith("/") and gcs.exists(path)


def detect_format(path: str) -> str | None:
    """The annotation format of `path`, None for a labels table (by its suffix).

    Raises AnnotationError: a .json that is not COCO, a folder of no annotation files or of
    several kinds, a path that cannot be listed."""
    if _table_suffix(path):
        return None
    if path.lower().endswith(".json"):
        coco, why = is_coco(path)
        if not coco:
            raise AnnotationError(
                f"--labels {path} is not a COCO instances file: {why} (a table of JSON objects, one a "
                "line, is JSON Lines: name it .jsonl or pass --labels_format jsonl)"
            )
        return COCO
    if not any(c in path for c in "*?[") and _is_file(path):
        raise AnnotationError(
            f"--labels {path}: cannot tell the format from the name; pass --labels_format "
            "csv|tsv|jsonl (a table), or coco, voc, yolo, segmentation (a file or folder of annotations)"
        )
    suffixes = tuple(_FOLDER_FORMATS)
    found = {posixpath.splitext(p)[1].lower() for p in list_files(path, suffixes, SNIFF_FILES)}
    kinds = sorted(_FOLDER_FORMATS[s] for s in found)
    if len(kinds) == 1:
        return kinds[0]
    if not kinds:
        raise AnnotationError(
            f"--labels {path}: cannot tell the format: no table suffix (.csv, .tsv, .jsonl), not a .json, and "
            "no .xml (voc), .txt (yolo) or .png (segmentation) files in it; pass --labels_format"
        )
    raise AnnotationError(
        f"--labels {path} holds files of {' and '.join(kinds)} ({', '.join(sorted(found))}); "
        f"pass --labels_format {'|'.join(kinds)}"
    )
