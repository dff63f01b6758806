"""Reading, writing, deleting and making paths of the output on any Beam filesystem (pure)."""

from __future__ import annotations

import os
import shutil

from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.images.read import read_with_retries
from transforms.paths import escape_glob


def read_file(path: str) -> bytes:
    """All bytes of `path` (local or gs://), transient errors retried; ReadError (an OSError) if not."""
    return read_with_retries(path)


def make_dirs(path: str) -> None:
    """Creates a folder and its parents (nothing to do on gs://, where folders are prefixes)."""
    try:
        FileSystems.mkdirs(path)
    except OSError:
        if not FileSystems.exists(path) and "://" not in path:
            raise


def delete_paths(paths: list[str]) -> None:
    """Deletes files and folders (recursively) that exist; missing ones are skipped.

    gs:// goes through transforms/gcs.py (batch deletes); other remote paths through Beam's
    delete, which takes a glob (so escaped; a folder is a prefix, deleted as `path/`).
    """
    for path in paths:
        if path.startswith("gs://"):
            if gcs.exists(path):
                gcs.delete_batch([path])
            else:
                bucket, prefix = gcs.split_gcs_path(path)
                gcs.delete_batch([f"gs://{bucket}/{name}" for name, _ in gcs.lister(bucket)(prefix, None)])
        elif "://" not in path:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        elif FileSystems.exists(path):
            FileSystems.delete([escape_glob(path)])
        else:
            FileSystems.delete([path.rstrip("/") + "/"])


def write_bytes(path: str, data: bytes, mime_type: str = "application/octet-stream") -> None:
    """Writes a whole file: gs:// in one request per attempt (transforms/gcs.py), others through Beam."""
    if path.startswith("gs://"):
        gcs.upload(path, data, mime_type)
        return
    with FileSystems.create(path, mime_type=mime_type) as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    """Writes `text` as UTF-8."""
    write_bytes(path, text.encode("utf-8"), mime_type="text/plain")
