"""ListImages: match image files under a root, local or gs://, through Beam's filesystems.

The match runs inside the pipeline (on workers), so the job graph stays the same size
whatever the number of files.
"""

from __future__ import annotations

import posixpath

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileMetadata

from transforms.records import ImageFile

# Matched case-insensitively against the file name's last suffix.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".psd", ".ico", ".tga")


def has_image_extension(path: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> bool:
    """True if `path` ends in one of `extensions`, ignoring case."""
    return posixpath.splitext(path)[1].lower() in extensions


def normalize_root(root: str) -> str:
    """The input root without a trailing separator; local roots made absolute."""
    if "://" in root:
        return root.rstrip("/")
    import os

    return os.path.abspath(root)


def relative_path(path: str, root: str) -> str:
    """`path` relative to `root`, '/'-separated."""
    rel = path[len(root) :].lstrip("/\\")
    return rel.replace("\\", "/")


def to_image_file(meta: FileMetadata, root: str) -> ImageFile:
    return ImageFile(path=meta.path, relpath=relative_path(meta.path, root), size=meta.size_in_bytes)


class ListImages(beam.PTransform):
    """Lists every image file below `root`, at any depth.

    Returns:
      PCollection[ImageFile], one per matched file (no order is implied).
    """

    def __init__(self, root: str, extensions: tuple[str, ...] = IMAGE_EXTENSIONS):
        super().__init__()
        self._root = normalize_root(root)
        self._extensions = tuple(e.lower() for e in extensions)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[ImageFile]:
        root, extensions = self._root, self._extensions
        return (
            pbegin
            | "MatchFiles"
            >> fileio.MatchFiles(root + "/**", empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
            | "KeepImages" >> beam.Filter(lambda m: has_image_extension(m.path, extensions))
            | "ToImageFile" >> beam.Map(to_image_file, root)
        )
