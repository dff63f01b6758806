"""The output folder's life cycle: stage a run in it, publish atomically, retry safely.

A run stages in `<output_dir>/beam-temp-img2tfrecord-<run_id>/` and keeps the marker
`.img2tfrecord-in-progress.json` from its claim until its dataset is published: summary.json
present and no marker means a finished dataset (docs/reliability.md, "Atomic output"). Local
folders and gs:// go through the same code (Beam's FileSystems, transforms/gcs.py; local
paths are never glob patterns); on gs:// one listing per folder tells what is left to move
and the moves and deletes go in batch requests, not one round trip per file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.gcs import DELIMITER, split_gcs_path
from transforms.paths import escape_glob
from transforms.testhooks import pause_if_asked
from transforms.writing.files import delete_paths

SUMMARY_FILE = "summary.json"
LABELS_FILE = "labels.txt"
FAILURES_FILE = "failures.jsonl"
# Metadata files of a dataset, in publishing order: summary.json, written last, marks it finished.
METADATA_FILES = (FAILURES_FILE, LABELS_FILE, SUMMARY_FILE)
MARKER_FILE = ".img2tfrecord-in-progress.json"
# Failures of a run that stopped short (exit 3) next to a kept dataset; the next one removes it.
ABORTED_FAILURES_FILE = "aborted-failures.jsonl"
# In a run's staging folder: why it stopped short (read by the entry point, exit 3).
ABORTED_FILE = "aborted.txt"
TEMP_PREFIX = "beam-temp-img2tfrecord-"
SHARD_NAME = re.compile(r".+-\d{5}-of-\d{5}\.tfrecord(\.gz|\.idx)?")
# Reader metadata (transforms/output/tfds.py) published next to the shards.
READER_FILES = (
    "dataset_info.json",
    "features.json",
    "label_map.pbtxt",
    "orphan_labels.jsonl",
    "class_counts.csv",
)
READER_FILE = re.compile(r".+\.labels\.txt")


class OutputBusy(ValueError):
    """The output folder holds a dataset (or another live run); the message says what to do."""


def is_dataset_file(name: str) -> bool:
    """True for a shard or metadata file name that a run of ours publishes."""
    return (
        name in METADATA_FILES
        or name in READER_FILES
        or name == ABORTED_FAILURES_FILE
        or SHARD_NAME.fullmatch(name) is not None
        or READER_FILE.fullmatch(name) is not None
    )


def temp_dir_for(output_dir: str, run_id: str) -> str:
    """Where a run's shards and metadata are staged (inside the output folder)."""
    return FileSystems.join(output_dir, f"{TEMP_PREFIX}{run_id}")


def staging_dir(temp_dir: str) -> str:
    """Where a run's metadata files wait to be published (see FinalizeFn)."""
    return FileSystems.join(temp_dir, "metadata")


def list_children(output_dir: str) -> list[str]:
    """Names directly inside `output_dir` (files and folders); [] if it does not exist."""
    if "://" not in output_dir:
        try:
            return sorted(os.listdir(output_dir))
        except (FileNotFoundError, NotADirectoryError):
            return []
    if output_dir.startswith("gs://"):  # one level (the delimiter), not every object below
        bucket, prefix = split_gcs_path(output_dir)
        return sorted({name[len(prefix) :].rstrip("/") for name, _ in gcs.lister(bucket)(prefix, DELIMITER)})
    prefix = output_dir.rstrip("/") + "/"
    found = FileSystems.match([escape_glob(prefix) + "**"])[0].metadata_list
    return sorted({m.path[len(prefix) :].split("/", 1)[0] for m in found})


def folder_exists(path: str) -> bool:
    """True if the folder `path` exists (on gs://: holds an object; one request of one name)."""
    if "://" not in path:
        return os.path.isdir(path)
    if path.startswith("gs://"):
        return bool(gcs.first_page(path.rstrip("/") + "/", 1))
    return bool(FileSystems.match([escape_glob(path.rstrip("/") + "/") + "**"], limits=[1])[0].metadata_list)


def existing_files(paths: list[str]) -> set[str]:
    """The files of `paths` that exist. On gs:// one listing (with the delimiter) per folder
    the paths are in, instead of one request per path."""
    found: set[str] = set()
    folders: dict[str, list[str]] = {}
    for path in paths:
        if path.startswith("gs://"):
            folders.setdefault(path.rsplit("/", 1)[0], []).append(path)
        elif os.path.lexists(path) if "://" not in path else gcs.exists(path):
            found.add(path)
    for folder, wanted in folders.items():
        bucket, prefix = split_gcs_path(folder)
        listed = gcs.lister(bucket)(prefix, DELIMITER)  # (name, size), size None for a folder
        found.update(
            {f"gs://{bucket}/{name}" for name, size in listed if size is not None}.intersection(wanted)
        )
    return found


def delete_files(paths: list[str]) -> None:
    """Deletes files (not folders) if they exist; on gs:// in batch requests (StoreUnreachable)."""
    remote = [p for p in paths if p.startswith("gs://")]
    delete_paths([p for p in paths if not p.startswith("gs://")])
    gcs.delete_batch(remote)


def rename_files(pairs: list[tuple[str, str]]) -> None:
    """Renames (source, destination) files; on gs:// in batch requests under the one retry policy."""
    remote = [pair for pair in pairs if pair[1].startswith("gs://")]
    local = [pair for pair in pairs if not pair[1].startswith("gs://")]
    if local:
        FileSystems.rename([src for src, _ in local], [dst for _, dst in local])
    gcs.rename_batch(remote)


class Fence(Protocol):
    """What publishing needs of a claim's token (fence.py, which imports this module)."""

    def held(self) -> AbstractContextManager[Callable[[], None]]: ...

    def remove_marker(self) -> None: ...


def _fenced(fence: Fence | None):
    """`fence.held()`, or no fence (tests of the renames alone)."""
    return fence.held() if fence is not None else contextlib.nullcontext(lambda: None)


def _remove_marker(output_dir: str, fence: Fence | None) -> None:
    if fence is not None:
        fence.remove_marker()
    else:
        delete_paths([FileSystems.join(output_dir, MARKER_FILE)])


def publish_failures_only(
    output_dir: str, staged_failures: str, fence: Fence, also: tuple[tuple[str, str], ...] = ()
) -> bool:
    """Publishes the failures of a run that stops short of a dataset (too many failures);
    True if an old dataset was kept. Fenced like publish; safe to run again after a crash.

    A finished dataset already in the folder (replaced with --overwrite) is kept whole: the
    failures go next to it as ABORTED_FAILURES_FILE and the marker is removed. Otherwise they
    are published as failures.jsonl, with `also` ((staged path, name) pairs that explain them:
    orphan_labels.jsonl), and the marker stays (an unfinished run's folder).
    """
    with fence.held():
        if not gcs.exists(FileSystems.join(output_dir, SUMMARY_FILE)):
            publish(output_dir, [(staged_failures, FAILURES_FILE), *also], keep_marker=True, fence=fence)
            return False
        final = FileSystems.join(output_dir, ABORTED_FAILURES_FILE)
        if gcs.exists(staged_failures):
            if "://" in final:
                delete_paths([final])  # copy-based renames may refuse to overwrite
            rename_files([(staged_failures, final)])
        fence.remove_marker()
    return True


def aborted_reason(output_dir: str, run_id: str) -> str | None:
    """Why run `run_id` did not publish its dataset, if it stopped on purpose (FinalizeFn)."""
    path = FileSystems.join(temp_dir_for(output_dir, run_id), ABORTED_FILE)
    if not gcs.exists(path):
        return None
    with FileSystems.open(path) as f:
        return f.read().decode("utf-8")


def publish(
    output_dir: str,
    moves: list[tuple[str, str]],
    keep_marker: bool = False,
    fence: Fence | None = None,
    cleanup: tuple[str, ...] = (),
) -> None:
    """Makes a staged run the dataset in `output_dir`. Safe to run again after a crash.

    `moves` are (staged path, final name) pairs. The old summary.json goes first (from then on
    the folder holds no finished dataset), then every other dataset file this run does not
    produce. The moves follow in three steps, each renamed at once (batches on gs://): the
    shards and reader files, then failures.jsonl and labels.txt, then summary.json; a move
    whose staged file is gone was done by an earlier try. Then `cleanup` (the run's staging
    folder) is deleted and the marker removed, unless `keep_marker` (a run that publishes only
    its failures). Every change is made inside `fence.held()`, renewed between the steps
    (`fence` None: unfenced, for tests of the renames alone).

    Raises:
      FileNotFoundError: a staged file is missing and was never published.
      ClaimLost: another run took the folder over.
    """

    def step_of(move: tuple[str, str]) -> int:
        return {FAILURES_FILE: 1, LABELS_FILE: 1, SUMMARY_FILE: 2}.get(move[1], 0)

    finals = {name: staged for staged, name in moves}
    with _fenced(fence) as keep:
        staged_now = existing_files([staged for staged, _ in moves])
        if SUMMARY_FILE not in finals or finals[SUMMARY_FILE] in staged_now:
            # Not yet published by this run (or an earlier try of it): retire the old one.
            delete_paths([FileSystems.join(output_dir, SUMMARY_FILE)])
        children = list_children(output_dir)
        stale = [n for n in children if is_dataset_file(n) and n not in finals]
        delete_files([FileSystems.join(output_dir, n) for n in stale])
        for _, step in itertools.groupby(sorted(moves, key=step_of), key=step_of):
            keep()
            pairs, replaced = [], []
            for staged, name in step:
                final = FileSystems.join(output_dir, name)
                if staged in staged_now:
                    pairs.append((staged, final))
                    if "://" in final and name in children:
                        replaced.append(final)  # copy-based renames may refuse to overwrite
                elif name not in children:
                    raise FileNotFoundError(
                        f"staged file {staged} is missing and {final} was never published"
                    )
            delete_files(replaced)
            if pairs:  # every file of the step at once (on gs:// copies, then deletes, in batches)
                rename_files(pairs)
            pause_if_asked("publish")
        delete_paths(list(cleanup))
        if not keep_marker:
            _remove_marker(output_dir, fence)
