"""Cheap checks before a conversion starts, for the two commonest all-images-fail mistakes.

In: the --input root and the options. Out: nothing, or a UserError whose one line names the
cause and the fix (exit 2), before any worker starts:

- a flat folder (no image inside a class folder) without --labels: every image would fail
  "not inside a class folder";
- a labels table none of whose keys matches an image key: every image would fail
  "label missing".

Both stop at the first evidence that all is well (an image in a class folder, one matching
key), so on a good input they cost one folder or one look-up. Nothing that grows with the
dataset is kept: the key check holds at most MAX_KEY_ROWS table keys, and gives up (the
pipeline reports per image) on a larger table or a gs:// input, whose listing is the
pipeline's job.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from beam_pipeline.cli.options import UserError
from transforms.labels.rows import IMAGE_KEYS, TableError, TableSpec
from transforms.labels.table import check_table, image_key, normalize_key
from transforms.listing.local import walk_folders
from transforms.paths import escape_glob, has_image_extension, relative_path

# The key check reads at most this many table rows (a set of short strings, a few MB).
MAX_KEY_ROWS = 100_000

# The flat-folder check on gs:// looks at one listing page, as main.check_remote_input does.
REMOTE_PAGE = 1000


def _local_images(root: str):
    """Yields the relative paths of the image files under local `root`, one at a time, walked as
    the listing walks it (hidden entries left out, folder links followed). A folder that cannot
    be listed, or a root that is a file (an archive), is check_input's to report."""
    for folder, names in walk_folders(root, onerror=lambda error: None):
        for name in names:
            if has_image_extension(name):
                yield relative_path(os.path.join(folder, name), root)


def _remote_images(root: str) -> tuple[list[str], bool]:
    """Relative paths of the images in the first listing page of a bucket prefix; complete?"""
    try:
        found = FileSystems.match([escape_glob(root) + "/**"], limits=[REMOTE_PAGE])[0].metadata_list
    except Exception:  # noqa: BLE001 - main.check_remote_input reports listing errors
        return [], False
    paths = [relative_path(m.path, root) for m in found]
    return [p for p in paths if has_image_extension(p)], len(found) < REMOTE_PAGE


def check_class_folders(root: str, split_from_folders: bool) -> None:
    """Raises UserError when no image sits inside a class folder (and no --labels was given).

    Stops at the first image deep enough. On gs:// only a listing of one page is looked at,
    and only a complete one (a small prefix) can prove that no image is in a folder.
    """
    depth = 3 if split_from_folders else 2
    if "://" in root:
        images, complete = _remote_images(root)
        if not complete or not images or any(p.count("/") + 1 >= depth for p in images):
            return
        count = len(images)
    else:
        count = 0
        for relpath in _local_images(root):
            if relpath.count("/") + 1 >= depth:
                return
            count += 1
        if not count:
            return  # main.check_input reports an input without images
    if split_from_folders:
        raise UserError(
            f"--input {root}: --splits folders takes each split from the first folder level, but "
            f"none of its {count:,} images is in a <split>/<class>/ folder ({root}/train/cat/"
            "image.jpg); put the class folders inside split folders, or split by ratios "
            "(--splits train=0.8,validation=0.2)"
        )
    raise UserError(
        f"--input {root}: none of its {count:,} images is inside a class folder ({root}/<class>/"
        "image.jpg); put each class in its own sub-folder, or give the labels in a table with "
        "--labels TABLE.csv"
    )


def _file_keys(path: str, spec: TableSpec) -> Iterator[str]:
    """The key column of one table file, read alone (the full row parse is the pipeline's job).

    About 10x faster than iter_table, whose per-row checks are not needed to compare keys;
    the keys are normalized the same way (normalize_key).
    """
    with FileSystems.open(path) as f:
        lines = (line.decode("utf-8", "replace") for line in iter(f.readline, b""))
        if spec.format == "jsonl":
            for line in lines:
                try:
                    obj = json.loads(line) if line.strip() else None
                except ValueError:
                    continue
                value = obj.get(spec.key_column) if isinstance(obj, dict) else None
                if value is not None and not isinstance(value, (dict, list)):
                    yield normalize_key(str(value))
            return
        reader = csv.reader(lines, delimiter="\t" if spec.format == "tsv" else ",")
        header = [h.strip().removeprefix("\ufeff") for h in next(reader, [])]
        if spec.key_column not in header:
            return
        column = header.index(spec.key_column)
        for cells in reader:
            if len(cells) > column:
                yield normalize_key(cells[column])


def _table_keys(spec: TableSpec) -> set[str] | None:
    """The keys of the table's rows, or None when it has more than MAX_KEY_ROWS rows."""
    keys: set[str] = set()
    for path in check_table(spec):
        for key in _file_keys(path, spec):
            if key:
                keys.add(key)
            if len(keys) > MAX_KEY_ROWS:
                return None
    return keys


def check_keys_match(root: str, spec: TableSpec, mode: str) -> None:
    """Raises UserError when no image key (by --image_key `mode`) is a key of the table.

    Local inputs and tables of up to MAX_KEY_ROWS rows only (else it returns: the
    pipeline's per-image failures and the exit-3 line tell). Stops at the first match. The
    message names the --image_key that would match, if one does.
    """
    if "://" in root:
        return
    try:
        keys = _table_keys(spec)
    except (TableError, OSError, csv.Error):
        return  # main.check_labels or the pipeline reports an unreadable table
    if not keys:
        return
    first_image = None
    other_modes = [m for m in IMAGE_KEYS if m != mode]
    would_match: str | None = None
    for relpath in _local_images(root):
        if image_key(relpath, mode) in keys:
            return
        first_image = first_image or relpath
        if would_match is None:
            would_match = next((m for m in other_modes if image_key(relpath, m) in keys), None)
    if first_image is None:
        return
    example_key = min(keys)
    fix = (
        f"pass --image_key {would_match}"
        if would_match
        else f"check --key_column ({spec.key_column!r}) and --image_key (stem, name or relpath)"
    )
    raise UserError(
        f"--labels {spec.path}: none of its {len(keys):,} keys matches an image (image "
        f"{first_image!r} has the --image_key {mode} key {image_key(first_image, mode)!r}; "
        f"the table has keys such as {example_key!r}): {fix}"
    )


def check_gcs_credentials(paths: list[str]) -> None:
    """Raises UserError at once when a gs:// path is given and no Google credentials exist.

    Without this, Beam retries the credentials look-up with back-off (four tracebacks, ~30
    s), connects anonymously, and the first listing then retries until its 120 s deadline.
    One look-up of Application Default Credentials (a key file named by
    GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file, or the metadata server on Google
    Cloud) answers in about a second. Skipped when STORAGE_EMULATOR_HOST points the
    clients at a local emulator, which takes anonymous requests.
    """
    remote = [p for p in paths if p and p.startswith("gs://")]
    if not remote or os.environ.get("STORAGE_EMULATOR_HOST"):
        return  # (an emulator, as google-cloud-storage itself assumes, needs no credentials)
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise UserError(
            f"{remote[0]}: no Google Cloud credentials found; run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file"
        ) from None
