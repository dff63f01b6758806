"""Labels from folder names, and the class index (class name -> id).

The class index is computed from the data: ids are the sorted class names, starting at
`offset` (0 for Keras/slim, 1 for inception/ODAPI).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from transforms.failures import FAILED, Failure
from transforms.records import ImageFile, ImageRecord

DEFAULT_SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class ClassIndex:
    """Class names in id order: `names[i]` has id `i + offset`."""

    names: tuple[str, ...]
    offset: int = 0

    def id_of(self, name: str) -> int:
        return self._ids()[name]

    def _ids(self) -> dict[str, int]:
        ids = self.__dict__.get("_ids_cache")
        if ids is None:
            ids = {n: i + self.offset for i, n in enumerate(self.names)}
            object.__setattr__(self, "_ids_cache", ids)
        return ids


def folder_label(relpath: str, split_from_folders: bool) -> tuple[str, str]:
    """Returns (split, class name) read from the folders of `relpath`.

    Raises:
      ValueError: the file is not inside a class folder.
    """
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


def check_folder_name(name: str) -> None:
    """A class or split folder name must be printable UTF-8 text (it goes into labels.txt,
    summary.json and the records, one name per line).

    Raises:
      ValueError: undecodable bytes or a control character such as a line break.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"folder name {name!r} is not valid UTF-8") from None
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"folder name {name!r} contains a control character (line break, tab, ...)")


class LabelFromFoldersFn(beam.DoFn):
    """ImageFile -> ImageRecord labelled by its class folder (and split folder)."""

    def __init__(self, split_from_folders: bool = False):
        self._split_from_folders = split_from_folders
        self._failed = Metrics.counter(self.__class__, "images_without_label")

    def process(self, f: ImageFile) -> Iterable[ImageRecord | pvalue.TaggedOutput]:
        try:
            split, name = folder_label(f.relpath, self._split_from_folders)
        except ValueError as e:
            self._failed.inc()
            yield pvalue.TaggedOutput(FAILED, Failure(f.path, str(e), "label"))
            return
        yield ImageRecord(path=f.path, relpath=f.relpath, size=f.size, labels=(name,), split=split)


class LabelFromFolders(beam.PTransform):
    """Labels each image by its class folder. Outputs `.records` and `.failed`."""

    def __init__(self, split_from_folders: bool = False):
        super().__init__()
        self._split_from_folders = split_from_folders

    def expand(self, files: beam.PCollection[ImageFile]) -> pvalue.DoOutputsTuple:
        return files | beam.ParDo(LabelFromFoldersFn(self._split_from_folders)).with_outputs(
            FAILED, main="records"
        )


def _sorted_names(names: Iterable[str]) -> list[str]:
    return sorted(set(names))


class BuildClassIndex(beam.PTransform):
    """The singleton ClassIndex of every class name that appears in `records`."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self._offset = offset

    def expand(self, records: beam.PCollection[ImageRecord]) -> beam.PCollection[ClassIndex]:
        offset = self._offset
        return (
            records
            | "Names" >> beam.FlatMap(lambda r: r.labels)
            | "Distinct" >> beam.Distinct()
            | "Sort" >> beam.combiners.ToList()
            | "ToIndex" >> beam.Map(lambda names: ClassIndex(tuple(sorted(names)), offset))
        )
