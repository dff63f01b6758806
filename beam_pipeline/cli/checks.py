"""The checks convert makes before the job starts (one line, exit 2, on a user error).

The input (exists, holds images or archives, is listable; a cheap look at gs://), the output
(claimed exclusively, writable), the labels table's header and whether every image would fail.
"""

from __future__ import annotations

import os
import sys

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.cli import preflight
from beam_pipeline.cli.options import (
    ConvertOptions,
    UserError,
    table_spec,
)
from transforms.gcs import ERRORS as LIST_ERRORS
from transforms.gcs import first_page
from transforms.labels.beam_webdataset import WEBDATASET
from transforms.labels.label_map import load_label_map
from transforms.labels.table import check_table
from transforms.listing.archives import archive_kind
from transforms.listing.local import is_archive_input, walk_folders
from transforms.output.claim import claim_output
from transforms.output.marker import Claim, NotWritable
from transforms.output.publish import (
    OutputBusy,
    list_children,
)
from transforms.paths import escape_glob, has_image_extension, normalize_root


def check_input(root: str) -> None:
    """Fails fast on a missing input or one without a single image file or archive.

    Remote inputs stop at the first image found: the listing itself happens inside the
    pipeline. A tar file or a glob of them must match at least one archive.
    """
    if is_archive_input(root):
        check_archives(root)
        return
    if "://" in root:
        check_remote_input(root)
        return
    if not os.path.isdir(root):
        raise UserError(f"--input {root}: {'not a folder' if os.path.exists(root) else 'no such folder'}")
    found = False
    # The whole tree, walked as the listing walks it (any depth, folder links followed): a
    # folder that cannot be listed would silently drop its images.
    for _, names in walk_folders(root, onerror=_unlistable):
        found = found or any(is_input_file(n) for n in names)
    if not found:
        raise UserError(f"--input {root}: no image files found")


def is_input_file(name: str) -> bool:
    return has_image_extension(name) or archive_kind(name) is not None


def check_archives(pattern: str) -> None:
    try:
        found = FileSystems.match([pattern], limits=[_REMOTE_CHECK_LIMIT])[0].metadata_list
    except BeamIOError as e:
        raise UserError(f"--input {pattern}: cannot list: {_first_line(e)}") from None
    if not any(archive_kind(m.path) for m in found):
        raise UserError(f"--input {pattern}: no such archive")


def _unlistable(error: OSError) -> None:
    raise UserError(f"--input: cannot list {error.filename}: {error.strerror}")


# How many objects the remote pre-check looks at: one listing page. Past that it gives up
# looking for an image; the pipeline itself reports an input without images.
_REMOTE_CHECK_LIMIT = 1000


def check_remote_input(root: str) -> None:
    """A cheap look at a bucket prefix: one page of its listing (on gs:// one request), never
    the whole of it."""
    try:
        if root.startswith("gs://"):
            found = first_page(root, _REMOTE_CHECK_LIMIT)
        else:
            matched = FileSystems.match([escape_glob(root) + "/**"], limits=[_REMOTE_CHECK_LIMIT])
            found = [m.path for m in matched[0].metadata_list]
    except (BeamIOError, *LIST_ERRORS) as e:
        raise UserError(f"--input {root}: cannot list: {_first_line(e)}") from None
    if len(found) < _REMOTE_CHECK_LIMIT and not any(is_input_file(path) for path in found):
        raise UserError(f"--input {root}: no image files found")


def _first_line(error: Exception) -> str:
    """The innermost useful line of a (possibly wrapped) filesystem error."""
    inner = getattr(error, "exception_details", None) or {}
    cause = next(iter(inner.values()), error) if isinstance(inner, dict) else error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def claim_output_folder(output_dir: str, overwrite: bool, run_id: str) -> Claim:
    """Claims the output folder for run `run_id` (writable, no live run, no dataset unless
    --overwrite), or raises UserError.

    The partial output of an interrupted run (its marker is there, its process is not) is
    taken over without asking, so that a retried job succeeds. See transforms/output/claim.py.
    """
    if "://" in output_dir:
        try:  # a missing bucket or no permission to list: say so before anything else
            list_children(output_dir)
        except (BeamIOError, *LIST_ERRORS) as e:
            raise UserError(f"--output_dir {output_dir}: cannot list: {_first_line(e)}") from None
    try:
        claim = claim_output(output_dir, overwrite, run_id)
    except (OutputBusy, NotWritable) as e:
        raise UserError(str(e)) from None
    if claim.resumed:  # a line for the user, as the CLI's others (not a raw log record)
        print(
            f"img2tfrecord: replacing the unfinished output of an earlier run ({claim.resumed}, "
            f"killed or failed) in {output_dir}",
            file=sys.stderr,
        )
    return claim


def check_labels(opts: ConvertOptions) -> None:
    """Fails fast on a missing table, missing columns or an unreadable --label_map."""
    try:
        if opts.labels_path != WEBDATASET:
            check_table(table_spec(opts))
        if opts.label_map:
            load_label_map(opts.label_map)
    except ValueError as e:
        raise UserError(str(e)) from None


def check_all_would_fail(opts: ConvertOptions) -> None:
    """The flat folder without --labels, and the table whose keys match no image (exit 2)."""
    root = normalize_root(opts.input)
    if not opts.labels_path:
        preflight.check_class_folders(root, opts.splits == "folders")
    elif opts.unlabeled == "fail":  # (skip: an empty dataset, reported by the pipeline)
        preflight.check_keys_match(root, table_spec(opts), opts.image_key)
