"""The Beam shells of folder labels (FileBatch -> RecordBatch and Failure), the label map and
the class index (singletons, bounded by the number of classes)."""

from __future__ import annotations

import collections
from collections.abc import Iterable

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from transforms.coders import SideList
from transforms.failures import FAILED, USER_ERROR_MARKER, Failure
from transforms.labels.folders import _index_or_user_error, folder_label
from transforms.labels.label_map import load_label_map
from transforms.labels.rows import LabelMap
from transforms.records import ClassIndex, FileBatch, RecordBatch


class LabelFromFoldersFn(beam.DoFn):
    """FileBatch -> RecordBatch of its files labelled by their class folder (and split
    folder); FAILED for each file outside a class folder."""

    def __init__(self, split_from_folders: bool = False):
        self._split_from_folders = split_from_folders
        self._failed = Metrics.counter(self.__class__, "images_without_label")

    def process(self, batch: FileBatch) -> Iterable[RecordBatch | pvalue.TaggedOutput]:
        paths, relpaths, sizes = batch.columns()
        by_folders = self._split_from_folders
        labels: list[tuple[str, ...]] = []
        splits: list[str] = []
        kept: list[int] = []
        one_label: dict[str, tuple[str]] = {}  # one tuple per class, shared by its records
        for i, relpath in enumerate(relpaths):
            try:
                split, name = folder_label(relpath, by_folders)
            except ValueError as e:
                self._failed.inc()
                yield pvalue.TaggedOutput(FAILED, Failure(paths[i], str(e), "label"))
                continue
            labels.append(one_label.setdefault(name, (name,)))
            splits.append(split)
            kept.append(i)
        if len(kept) < len(relpaths):
            paths, relpaths, sizes = ([column[i] for i in kept] for column in (paths, relpaths, sizes))
        if kept:
            yield RecordBatch.from_columns(paths, relpaths, sizes, labels, splits, ((),) * len(kept))


class LabelFromFolders(beam.PTransform):
    """Labels each image by its class folder. Outputs `.records` (RecordBatch) and `.failed`."""

    def __init__(self, split_from_folders: bool = False):
        super().__init__()
        self._split_from_folders = split_from_folders

    def expand(self, files: beam.PCollection[FileBatch]) -> pvalue.DoOutputsTuple:
        fn = LabelFromFoldersFn(self._split_from_folders)
        return files | beam.ParDo(fn).with_output_types(RecordBatch).with_outputs(FAILED, main="records")


class ClassNamesFn(beam.CombineFn):
    """Every label of the records, as a set: one cheap call per batch (lifted), no shuffle
    of names as a Distinct would."""

    def create_accumulator(self) -> set[str]:
        return set()

    def add_input(self, names: set[str], batch: RecordBatch) -> set[str]:
        for labels in set(batch.labels):
            names.update(labels)
        return names

    def merge_accumulators(self, accumulators: Iterable[set[str]]) -> set[str]:
        return set().union(*accumulators)

    def extract_output(self, names: set[str]) -> list[str]:
        return sorted(names)


def split_class_counts(batch: RecordBatch) -> Iterable[tuple[tuple[str, str], int]]:
    """((split, class_key), records) per pair of `batch`: summed by batching.SumPerKeyFn into
    {(split, class_key): images} (bounded by splits x classes)."""
    return collections.Counter(zip(batch.splits, batch.class_keys())).items()


def _label_map_or_user_error(path: str, offset: int) -> LabelMap:
    try:
        return load_label_map(path, offset)
    except ValueError as e:
        raise ValueError(f"{USER_ERROR_MARKER} {e}") from None


class ReadLabelMap(beam.PTransform):
    """The --label_map file as a singleton LabelMap, read once on a worker: its names reach
    JoinLabels and BuildClassIndex as a side input, never pickled into a step, so the job
    graph is the same size for ten classes or GLDv2's 203,094 (Dataflow refuses a graph of
    10 MB). Bounds: one element, the map's names.
    """

    def __init__(self, path: str, offset: int = 0):
        super().__init__()
        self._path, self._offset = path, offset

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[LabelMap]:
        path, offset = self._path, self._offset
        return (
            pbegin
            | "Once" >> beam.Impulse()
            | "Load" >> beam.Map(lambda _: _label_map_or_user_error(path, offset)).with_output_types(LabelMap)
        )


class BuildClassIndex(beam.PTransform):
    """The singleton ClassIndex of every class name in `records` (RecordBatches), by
    class_index_for; with `label_map` (ReadLabelMap's singleton), exactly its names and ids."""

    def __init__(
        self,
        offset: int = 0,
        *,
        label_map: beam.PCollection[LabelMap] | None = None,
        label_type: str = "str",
    ):
        super().__init__()
        self._offset = offset
        self._label_map = label_map
        self._label_type = label_type

    def expand(self, records: beam.PCollection[RecordBatch]) -> beam.PCollection[ClassIndex]:
        offset, label_type = self._offset, self._label_type
        if self._label_map is not None:
            return self._label_map | "FromMap" >> beam.Map(lambda m: ClassIndex(m.names, m.first_id))
        # Without records (all failed) the index has no names: a side-input default, which
        # costs two steps where CombineGlobally's default element costs seven.
        names = (
            records
            | "Names" >> beam.CombineGlobally(ClassNamesFn()).without_defaults()
            | "NamesSide" >> beam.Map(SideList).with_output_types(SideList)
        )  # sorted labels, a side input sized without a walk
        return (
            records.pipeline
            | "Once" >> beam.Impulse()
            | "ToIndex"
            >> beam.Map(
                lambda _, found: _index_or_user_error(found, offset, label_type),
                pvalue.AsSingleton(names, default_value=[]),
            )
        )
