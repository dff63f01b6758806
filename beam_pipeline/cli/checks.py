"""The checks convert makes before the job starts (one line, exit 2, on a user error).

The runner (a remote one with a local path, a classic template: refused before anything
else), the input (exists, holds images or archives, is listable; a cheap look at gs://), the
output (claimed exclusively, writable), the labels table's header and whether every image
would fail.
"""

from __future__ import annotations

import os
import sys
import urllib.parse

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SparkRunnerOptions,
    StandardOptions,
)

from beam_pipeline.cli import preflight
from beam_pipeline.cli.options import (
    ConvertOptions,
    UserError,
    table_spec,
)
from transforms.gcs import ERRORS as LIST_ERRORS
from transforms.gcs import first_page, literal_or_glob
from transforms.labels.beam_webdataset import WEBDATASET
from transforms.labels.label_map import load_label_map
from transforms.labels.table import check_table
from transforms.listing.archives import archive_kind
from transforms.listing.local import is_archive_input, walk_folders
from transforms.output.claim import NotWritable, claim_output
from transforms.output.fence import Claim
from transforms.output.publish import (
    OutputBusy,
    list_children,
)
from transforms.paths import escape_glob, has_image_extension, normalize_root

# Runner names (lower case, without "Runner") whose steps run in this process or its children.
_LOCAL_RUNNERS = ("", "direct", "fnapi", "bundlebaseddirect", "switchingdirect", "testdirect", "interactive")

# Addresses that are this machine, and the endpoints that start a job service here.
_THIS_MACHINE = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")
_HERE = ("embed", "[local]", "[auto]")


def _elsewhere(address: str) -> bool:
    """An address (host:port, a URL, Flink's "[auto]", Spark's "local[4]") that is not this machine."""
    if address in _HERE or address.startswith("local"):
        return False
    host = urllib.parse.urlsplit(address if "://" in address else f"//{address}").hostname
    return (host or "") not in _THIS_MACHINE


def remote_workers(options: PipelineOptions) -> str | None:
    """Where the job's steps run when that is not this machine (they cannot read its files), or None.

    Remote: DataflowRunner; a runner whose job service or cluster is on another host
    (--job_endpoint, --flink_master, --spark_master_url); SDK workers in Docker containers
    (--environment_type DOCKER, PortableRunner's default), which see none of this machine's
    files; a worker pool on another host (--environment_type EXTERNAL). Beam's local runners
    and a job service here with LOOPBACK, PROCESS or a worker pool here read local paths.
    """
    runner = options.view_as(StandardOptions).runner or ""
    name = str(runner).rsplit(".", 1)[-1].lower().removesuffix("runner")
    if name in _LOCAL_RUNNERS:
        return None
    if "dataflow" in name:
        return f"--runner {runner} runs the job on Google Cloud workers"
    portable = options.view_as(PortableOptions)
    for flag, address in (
        ("--job_endpoint", portable.job_endpoint),
        ("--flink_master", options.view_as(FlinkRunnerOptions).flink_master),
        ("--spark_master_url", options.view_as(SparkRunnerOptions).spark_master_url),
    ):
        if address and _elsewhere(address):
            return f"{flag} {address} runs the job on another machine"
    environment = (portable.environment_type or ("DOCKER" if name == "portable" else "")).upper()
    if environment == "DOCKER":
        return "the job's SDK workers run in Docker containers (--environment_type DOCKER, PortableRunner's default)"
    if environment == "EXTERNAL":
        pool = portable.environment_config or next(
            (
                o.split("=", 1)[1]
                for o in portable.environment_options or ()
                if o.startswith("external_service_address=")
            ),
            "",
        )
        if _elsewhere(pool):
            return f"the job's SDK workers run in the worker pool at {pool}, on another machine"
    return None


def check_runner_reaches_paths(options: PipelineOptions, opts: ConvertOptions) -> None:
    """A remote runner with a local path, or a classic template: one line (exit 2), before any
    credential check, claim or graph. Without it the job was built and submitted, and failed
    (or hung) on workers that cannot see the path.

    Classic templates (--template_location) are refused: the run id, temp folder and claim
    of this launch would be baked into the template and shared by every later launch, which
    would skip the checks. The Flex Template (docs/cloud.md) runs the CLI at each launch.
    """
    if options.view_as(GoogleCloudOptions).template_location:
        raise UserError(
            "--template_location: a classic template would reuse this launch's run id, temp folder "
            "and output claim on every launch; build the Flex Template instead (docs/cloud.md, "
            '"Flex Template")'
        )
    where = remote_workers(options)
    if where is None:
        return
    labels = opts.labels_path if opts.labels_path != WEBDATASET else None
    for flag, path in (
        ("--input", opts.input),
        ("--output_dir", opts.output_dir),
        ("--labels", labels),
        ("--label_map", opts.label_map),
    ):
        if path and "://" not in path:
            raise UserError(
                f"{flag} {path} is a path on this machine, but {where}, which cannot read it: "
                "copy it to a bucket and pass its gs:// path"
            )


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
        found = FileSystems.match([literal_or_glob(pattern)], limits=[_REMOTE_CHECK_LIMIT])[0].metadata_list
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


def claim_output_folder(output_dir: str, overwrite: bool, run_id: str, job: bool = False) -> Claim:
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
        claim = claim_output(output_dir, overwrite, run_id, job)
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
