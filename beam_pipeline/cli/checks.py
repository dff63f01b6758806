"""The checks convert makes before the job starts, each failing in one line (exit 2).

In main.py's order: the runner, credentials for gs:// paths, the input, the labels table and
--label_map, the two commonest all-images-fail mistakes (a flat folder without --labels; no
table key matching an image), then the output folder's claim. Each stops at the first
evidence that all is well and holds nothing that grows with the dataset: a remote input is
looked at one listing page (REMOTE_PAGE) deep, the key check reads at most MAX_KEY_ROWS keys.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Iterator

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

from beam_pipeline.cli.options import (
    AUTO,
    ConvertOptions,
    UserError,
    labels_kind,
    validate_annotation_flags,
)
from beam_pipeline.settings import table_spec
from transforms import gcs
from transforms.gcs import ERRORS as LIST_ERRORS
from transforms.gcs import first_page, literal_or_glob, split_gcs_path
from transforms.labels.annotations import coco
from transforms.labels.annotations.box_table import parse_box_columns
from transforms.labels.annotations.detect import SNIFF_FILES, SUFFIXES, detect_format, is_coco
from transforms.labels.annotations.files import list_files
from transforms.labels.annotations.rows import ANNOTATION_FORMATS, COCO, YOLO, AnnotationError
from transforms.labels.annotations.yolo import load_class_names
from transforms.labels.beam_table import WEBDATASET
from transforms.labels.label_map import load_label_map
from transforms.labels.rows import IMAGE_KEYS, KEY, TableError, TableSpec, decode_text
from transforms.labels.table import check_regular_file, check_table, image_key, iter_row_batches, read_header
from transforms.listing.archives import archive_kind
from transforms.listing.local import is_archive_input, walk_folders
from transforms.output.claim import NotWritable, claim_output
from transforms.output.fence import Claim
from transforms.output.publish import OutputBusy, list_children
from transforms.paths import escape_glob, has_image_extension, normalize_root, relative_path
from transforms.retry import GaveUp

# Runner names (lower case, without "Runner") whose steps run in this process or its children.
_LOCAL_RUNNERS = ("", "direct", "fnapi", "bundlebaseddirect", "switchingdirect", "testdirect", "interactive")

# Addresses that are this machine, and the endpoints that start a job service here.
_THIS_MACHINE = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")
_HERE = ("embed", "[local]", "[auto]")

# Objects a check looks at in a remote input (one listing page); past that the pipeline reports.
REMOTE_PAGE = 1000

# The key check reads at most this many table rows (a set of short strings, a few MB).
MAX_KEY_ROWS = 100_000


def _elsewhere(address: str) -> bool:
    """An address (host:port, a URL, Flink's "[auto]", Spark's "local[4]") that is not this machine."""
    if address in _HERE or address.startswith("local"):
        return False
    host = urllib.parse.urlsplit(address if "://" in address else f"//{address}").hostname
    return (host or "") not in _THIS_MACHINE


def remote_workers(options: PipelineOptions) -> str | None:
    """Where the job's steps run when that is not this machine (they cannot read its files), or None:
    Dataflow, a job service or cluster on another host, SDK workers in Docker (PortableRunner's
    default) or in a worker pool on another host.
    """
    runner = options.view_as(StandardOptions).runner or ""
    name = _runner_name(options)
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


def _runner_name(options: PipelineOptions) -> str:
    runner = options.view_as(StandardOptions).runner or ""
    return str(runner).rsplit(".", 1)[-1].lower().removesuffix("runner")


def workers_in_launcher(options: PipelineOptions) -> bool:
    """True when a runner other than the local one runs the job's steps in this process's own
    SDK workers, which die with it (`--environment_type LOOPBACK`, given or the runner's
    default: Prism's, and Flink's and Spark's on a local master), or from this process (Beam's
    DaskRunner, whose client is this process): the job ends when the launcher does."""
    name = _runner_name(options)
    if name in _LOCAL_RUNNERS:
        return False
    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    if environment:
        return environment == "LOOPBACK"
    if name == "flink":
        return options.view_as(FlinkRunnerOptions).flink_master in ("[auto]", "[local]")
    if name == "spark":
        return (options.view_as(SparkRunnerOptions).spark_master_url or "").startswith("local")
    return name in ("prism", "dask")


def check_runner_reaches_paths(options: PipelineOptions, opts: ConvertOptions) -> None:
    """Refuses a local path given to a remote runner (its workers would fail or hang), and a
    classic template (its launches would share this launch's run id, temp folder and claim)."""
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


def check_gcs_credentials(paths: list[str]) -> None:
    """Raises UserError at once for a gs:// path without Google credentials (else Beam retries
    for ~30 s, then lists until its 120 s deadline). Skipped for STORAGE_EMULATOR_HOST."""
    remote = [p for p in paths if p and p.startswith("gs://")]
    if not remote or os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise UserError(
            f"{remote[0]}: no Google Cloud credentials found; run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file"
        ) from None


def _first_line(error: Exception) -> str:
    """The innermost useful line of a (possibly wrapped) filesystem error."""
    inner = getattr(error, "exception_details", None) or {}
    cause = next(iter(inner.values()), error) if isinstance(inner, dict) else error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def _first_page(root: str) -> list[str]:
    """The paths of one listing page (REMOTE_PAGE objects, one request on gs://) below a
    bucket prefix. Raises UserError when it cannot be listed."""
    try:
        if root.startswith("gs://"):
            bucket, _ = split_gcs_path(root)
            return [f"gs://{bucket}/{name}" for name in first_page(root, REMOTE_PAGE)]
        matched = FileSystems.match([escape_glob(root) + "/**"], limits=[REMOTE_PAGE])
        return [m.path for m in matched[0].metadata_list]
    except (BeamIOError, *LIST_ERRORS) as e:
        raise UserError(f"--input {root}: cannot list: {_first_line(e)}") from None


def _is_input_file(name: str) -> bool:
    return has_image_extension(name) or archive_kind(name) is not None


def _unlistable(error: OSError) -> None:
    raise UserError(f"--input: cannot list {error.filename}: {error.strerror}")


def check_input(root: str) -> None:
    """Fails fast on a missing input or one without a single image file or archive.

    A tar file or glob must match an archive. A local folder is walked whole, as the listing
    walks it: a folder that cannot be listed would silently drop its images.
    """
    if is_archive_input(root):
        try:
            matched = FileSystems.match([literal_or_glob(root)], limits=[REMOTE_PAGE])[0].metadata_list
        except (BeamIOError, *LIST_ERRORS) as e:
            then = "; rerun when it is reachable" if isinstance(e, GaveUp) else ""
            raise UserError(f"--input {root}: cannot list: {_first_line(e)}{then}") from None
        if not any(archive_kind(m.path) for m in matched):
            raise UserError(f"--input {root}: no such archive")
        return
    if "://" in root:
        found = _first_page(root)
        if len(found) < REMOTE_PAGE and not any(_is_input_file(path) for path in found):
            raise UserError(f"--input {root}: no image files found")
        return
    if not os.path.isdir(root):
        raise UserError(f"--input {root}: {'not a folder' if os.path.exists(root) else 'no such folder'}")
    found = False
    for _, names in walk_folders(root, onerror=_unlistable):
        found = found or any(_is_input_file(n) for n in names)
    if not found:
        raise UserError(f"--input {root}: no image files found")


def check_labels(opts: ConvertOptions) -> None:
    """Fails fast on a missing table or column, an unreadable --label_map, and the mistakes
    that would fail every image (check_class_folders, check_keys_match)."""
    root = normalize_root(opts.input)
    if not opts.labels_path:
        check_class_folders(root, opts.splits == "folders")
        return
    kind = labels_kind(opts)
    if kind in ANNOTATION_FORMATS or kind == AUTO:
        found = check_annotations(opts, kind)
        raise UserError(_NOT_CONVERTED.format(what=f"--labels_format {found}"))
    try:
        spec = table_spec(opts)
        if opts.labels_path != WEBDATASET:
            check_table(spec)
        if opts.label_map:
            load_label_map(opts.label_map)
        if opts.box_columns:
            check_box_columns(spec, parse_box_columns(opts.box_columns))
    except ValueError as e:
        raise UserError(str(e)) from None
    if opts.unlabeled == "fail":  # (skip: an empty dataset, reported by the pipeline)
        check_keys_match(root, spec, opts.image_key)
    if opts.box_columns:
        raise UserError(_NOT_CONVERTED.format(what="--box_columns"))


# Issue 31 in progress: the annotation readers and their checks are in, the join of their rows
# with the images is not (it rides on the columnar labels join of issue 30).
_NOT_CONVERTED = (
    "{what}: the annotations check out, but converting boxes is not built yet (issue 31: their rows "
    "join the images once the columnar labels join lands); nothing was written"
)


def check_annotations(opts: ConvertOptions, kind: str) -> str:
    """The annotation format of --labels (detected for AUTO), after cheap checks on the
    submitting machine: a COCO file starts as one (and, when local, its categories read:
    one pass over the file that checks its JSON to the end), a folder holds files of its
    format, and --label_map reads (for YOLO, a names file or data.yaml). Raises UserError."""
    path = opts.labels_path
    try:
        found = detect_format(path) if kind == AUTO else kind
        validate_annotation_flags(opts, found)
        if found == COCO:
            _check_coco(path)
        elif not next(list_files(path, (SUFFIXES[found],), SNIFF_FILES), None):
            raise UserError(f"--labels {path}: no {SUFFIXES[found]} files ({found} annotations) found")
        if found == YOLO:
            load_class_names(opts.label_map)
        elif opts.label_map:
            load_label_map(opts.label_map)
    except ValueError as e:  # AnnotationError, a --label_map's
        raise UserError(str(e)) from None
    return found


def _check_coco(path: str) -> None:
    if not gcs.exists(path):
        raise UserError(f"--labels {path}: no such file")
    check_regular_file(path)
    starts, why = is_coco(path)
    if not starts:
        raise AnnotationError(f"--labels {path} is not a COCO instances file: {why}")
    if "://" not in path:
        with open(path, "rb") as f:
            coco.read_categories(f, path)


def check_box_columns(spec: TableSpec, boxes: tuple[str, ...]) -> None:
    """TableError unless every table file's header has the --box_columns."""
    for path in check_table(spec):
        header = [h.strip() for h in read_header(path, spec)]
        missing = [c for c in boxes if c not in header]
        if missing:
            raise TableError(
                f"labels table {path} has no column {missing[0]!r} (columns: {', '.join(header[:12])}); "
                "fix --box_columns"
            )


def _local_images(root: str) -> Iterator[str]:
    """The relative paths of the image files under local `root`, walked as the listing walks it."""
    for folder, names in walk_folders(root, onerror=lambda error: None):
        for name in names:
            if has_image_extension(name):
                yield relative_path(os.path.join(folder, name), root)


def check_class_folders(root: str, split_from_folders: bool) -> None:
    """Raises UserError when no image sits inside a class folder (and no --labels): every image
    would fail. Stops at the first image deep enough; on gs:// only a complete first page
    (a small prefix) can prove it.
    """
    depth = 3 if split_from_folders else 2
    if "://" in root:
        try:
            found = _first_page(root)
        except UserError:  # check_input reports listing errors
            return
        images = [p for p in (relative_path(path, root) for path in found) if has_image_extension(p)]
        if len(found) >= REMOTE_PAGE or not images or any(p.count("/") + 1 >= depth for p in images):
            return
        count = len(images)
    else:
        count = 0
        for relpath in _local_images(root):
            if relpath.count("/") + 1 >= depth:
                return
            count += 1
        if not count:
            return  # check_input reports an input without images
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


def _table_keys(spec: TableSpec) -> set[str] | None:
    """The keys of the table's rows, parsed as the pipeline parses them, or None when it has
    more than MAX_KEY_ROWS rows."""
    keys: set[str] = set()
    for path in check_table(spec):
        with FileSystems.open(path) as f:
            for batch in iter_row_batches(f, spec, path):
                keys.update(key for key in decode_text(batch.column(KEY)) if key)
                if len(keys) > MAX_KEY_ROWS:
                    return None
    return keys


def check_keys_match(root: str, spec: TableSpec, mode: str) -> None:
    """Raises UserError when no image key (--image_key `mode`) is in the table: every image
    would fail. The message names the --image_key that would match. Local inputs and tables
    of up to MAX_KEY_ROWS rows only; stops at the first match.
    """
    if "://" in root:
        return
    try:
        keys = _table_keys(spec)
    except (TableError, OSError):
        return  # check_table or the pipeline reports an unreadable table
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
    fix = (
        f"pass --image_key {would_match}"
        if would_match
        else f"check --key_column ({spec.key_column!r}) and --image_key (stem, name or relpath)"
    )
    raise UserError(
        f"--labels {spec.path}: none of its {len(keys):,} keys matches an image (image "
        f"{first_image!r} has the --image_key {mode} key {image_key(first_image, mode)!r}; "
        f"the table has keys such as {min(keys)!r}): {fix}"
    )


def claim_output_folder(output_dir: str, overwrite: bool, run_id: str, job: bool = False) -> Claim:
    """Claims the output folder for run `run_id` (writable, no live run, no dataset unless
    --overwrite), or raises UserError. An interrupted run's output is taken over, so that a
    retried job succeeds (transforms/output/claim.py).
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
