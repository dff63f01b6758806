"""ConvertOptions: the converter's flags (parsed with Beam's), their checks (validate,
check_args) and the settings they give the stages (EncodeSettings, TableSpec, JoinSettings)."""

from __future__ import annotations

import argparse
import codecs
import re

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.settings import encode_settings
from transforms.encoding.objects import INVALID_BOX_POLICIES, TRUST_SIZE
from transforms.encoding.schema import DEFAULT_SCHEMA, PRESETS, SLIM
from transforms.images.types import (
    COLORS,
    DEFAULT_JPEG_QUALITY,
    DEFAULT_MAX_PIXELS,
    IMAGE_FORMATS,
    RESIZE_MODES,
    STORES,
)
from transforms.labels.annotations.box_table import BOX_UNITS, parse_box_columns
from transforms.labels.annotations.rows import ANNOTATION_FORMATS, COCO, YOLO
from transforms.labels.beam_table import WEBDATASET
from transforms.labels.rows import (
    DUPLICATE_POLICIES,
    FORMATS,
    IMAGE_KEYS,
    LABEL_TYPES,
    UNLABELED_POLICIES,
)
from transforms.labels.table import detect_format, parse_extra_columns
from transforms.layout.plan import (
    DEFAULT_MAX_RECORDS_PER_SHARD,
    DEFAULT_SEED,
    DEFAULT_SHARD_SIZE_MB,
    parse_split_ratios,
)
from transforms.writing.shard import COMPRESSIONS

# Above this fraction of failed images the job fails rather than publish the dataset.
DEFAULT_MAX_FAILURE_RATIO = 0.01


class UserError(Exception):
    """A mistake in the command line or the input: reported in one line, no traceback."""


# The flags that runs on the local runner rarely need: `convert --help` leaves them to `--help_all`.
LOCAL_RUNNER_GROUP = "local runner"


class ConvertOptions(PipelineOptions):
    """Options of `img2tfrecord convert` (add_flags)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_flags(parser)


def add_flags(parser, *, labels_flag: str = "--labels_path", local_runner: bool = True) -> None:
    """ConvertOptions' flags, in the groups `convert --help` shows them in.

    The help prints each flag's default, so the texts do not repeat it. The help names the
    labels table's flag `labels_flag="--labels"`, as users give it (route_labels_flag), and
    leaves the local-runner group to `--help_all`.
    """
    group = parser.add_argument_group("input")
    group.add_argument("--input", metavar="PATH", help="Required: images (folder, gs:// prefix, tars).")
    group.add_argument("--dedupe", action="store_true", help="Drop byte-identical duplicates.")
    group.add_argument(
        "--max_pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="N", help="Larger images fail."
    )

    group = parser.add_argument_group("labels")
    group.add_argument(
        labels_flag,
        dest="labels_path",
        default="",
        metavar="PATH",
        help="A table (CSV, TSV, JSONL; gs://, globs), annotations or 'webdataset'; '': folders.",
    )
    group.add_argument(
        "--labels_format",
        choices=("auto",) + FORMATS + ANNOTATION_FORMATS,
        default="auto",
        metavar="FORMAT",
        help="auto, csv, tsv, jsonl; coco, voc, yolo, segmentation (docs/detection.md).",
    )
    group.add_argument(
        "--labels_encoding",
        default="utf-8",
        metavar="CODEC",
        help="Encoding (cp949, latin-1, ...).",
    )
    group.add_argument(
        "--labels_delimiter", default="", metavar="CHAR", help="CSV delimiter ('': comma; tsv: tab)."
    )
    group.add_argument("--key_column", default="id", metavar="COL", help="Column of the image key.")
    group.add_argument("--label_column", default="label", metavar="COL", help="Column of the label(s).")
    group.add_argument(
        "--box_columns",
        default="",
        metavar="COLS",
        help="Box columns xmin,ymin,xmax,ymax.",
    )
    group.add_argument(
        "--box_units",
        choices=BOX_UNITS,
        default="pixels",
        metavar="UNITS",
        help="pixels or normalized.",
    )
    group.add_argument(
        "--image_key",
        choices=IMAGE_KEYS,
        default="stem",
        metavar="KEY",
        help="A file's stem, name or relpath.",
    )
    group.add_argument(
        "--label_separator", default="|", metavar="SEP", help="Splits one cell into several labels."
    )
    group.add_argument(
        "--label_type",
        choices=LABEL_TYPES,
        default="auto",
        help="int: class ids as given; str: names; auto: int if all are.",
    )
    group.add_argument(
        "--label_map",
        default="",
        metavar="PATH",
        help="Class names in id order, one a line, or a .csv/.tsv of id,name.",
    )
    group.add_argument(
        "--extra_columns",
        default="",
        metavar="SPEC",
        help="Columns kept as features: name:int|float|str,...",
    )
    group.add_argument(
        "--unlabeled",
        choices=UNLABELED_POLICIES,
        default="fail",
        help="Images without a label row: a failure, skipped (counted) or kept.",
    )
    group.add_argument(
        "--duplicate_keys",
        choices=DUPLICATE_POLICIES,
        default="fail",
        help="Rows of one key that disagree: a failure, first wins, or all (multi-label).",
    )
    group.add_argument("--label_offset", type=int, choices=(0, 1), default=0, help="Id of the first class.")

    group = parser.add_argument_group("splits and shards")
    group.add_argument(
        "--splits",
        default="",
        metavar="SPEC",
        help="'folders' (<split>/<class>/...) or ratios 'train=0.8,validation=0.2' by a "
        "seeded hash of each path. Empty: all 'train'.",
    )
    group.add_argument("--split_column", default="", metavar="COL", help="Labels table column of the split.")
    group.add_argument("--stratify", action="store_true", help="Keep class ratios in every split.")
    group.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, metavar="N", help="Seed of the shuffle and split hash."
    )
    group.add_argument(
        "--shard_size_mb",
        type=float,
        default=DEFAULT_SHARD_SIZE_MB,
        metavar="MB",
        help="Target shard size.",
    )
    group.add_argument(
        "--max_records_per_shard",
        type=int,
        default=DEFAULT_MAX_RECORDS_PER_SHARD,
        metavar="N",
        help="Caps shards of tiny images, at about N (0: no cap).",
    )
    group.add_argument(
        "--num_shards", type=int, default=0, metavar="N", help="Shards per split (0: by size)."
    )

    group = parser.add_argument_group("images and schema")
    group.add_argument(
        "--image_format",
        choices=IMAGE_FORMATS,
        default="keep",
        help="keep: the file's bytes if TensorFlow decodes them, else PNG.",
    )
    group.add_argument(
        "--jpeg_quality",
        type=int,
        default=DEFAULT_JPEG_QUALITY,
        metavar="Q",
        help="Of re-encoded JPEGs (1-100).",
    )
    group.add_argument("--resize", default="", metavar="WxH", help="Exact size of every image.")
    group.add_argument(
        "--max_side", type=int, default=0, metavar="N", help="Longer side at most N (0: as is)."
    )
    group.add_argument(
        "--resize_mode",
        choices=RESIZE_MODES,
        default="pad",
        help="--resize: fit with black bands, cover and crop, or stretch.",
    )
    group.add_argument("--color", choices=COLORS, default="keep", help="rgb: 3 channels; grayscale: 1.")
    group.add_argument("--exif_transpose", action="store_true", help="Apply the EXIF orientation.")
    group.add_argument("--store", choices=STORES, default="encoded", help="raw: uint8 pixels (HWC).")
    group.add_argument(
        "--schema", choices=sorted(PRESETS), default=DEFAULT_SCHEMA, help="Feature keys preset."
    )
    group.add_argument(
        "--rename_keys", default="", metavar="SPEC", help="Key renames on top of --schema: old=new,..."
    )

    # Annotations (boxes, masks, class maps): docs/detection.md.
    group.add_argument(
        "--invalid_boxes",
        choices=INVALID_BOX_POLICIES,
        default="fail",
        metavar="POLICY",
        help="Bad boxes: fail, clip or drop.",
    )
    group.add_argument(
        "--trust_size",
        choices=TRUST_SIZE,
        default="fail",
        metavar="WHICH",
        help="Declared size != image's: fail, image, annotation.",
    )
    group.add_argument("--masks", action="store_true", help="Instance masks as PNG (odapi).")

    group = parser.add_argument_group("output and reliability")
    group.add_argument("--output_dir", metavar="PATH", help="Required. Where shards and metadata go.")
    group.add_argument("--overwrite", action="store_true", help="Replace a dataset in --output_dir.")
    group.add_argument(
        "--compression",
        choices=sorted(COMPRESSIONS),
        default="none",
        help="gzip: .tfrecord.gz (TFDS cannot read it).",
    )
    group.add_argument("--write_index", action="store_true", help="<shard>.idx files for DALI, PyTorch.")
    group.add_argument("--dataset_name", default="", metavar="NAME", help="TFDS name ('': --input's).")
    group.add_argument(
        "--max_failure_ratio",
        type=float,
        default=DEFAULT_MAX_FAILURE_RATIO,
        metavar="R",
        help="More failed images than this fraction: exit 3, nothing published.",
    )
    group.add_argument("--quiet", action="store_true", help="No progress output.")
    group.add_argument(
        "--progress_interval",
        type=float,
        default=10.0,
        metavar="S",
        help="Seconds between progress lines when stderr is no terminal.",
    )

    if not local_runner:
        return
    group = parser.add_argument_group(LOCAL_RUNNER_GROUP)
    group.add_argument(
        "--write_processes",
        type=int,
        default=0,
        metavar="N",
        help="Processes that write whole shards (0: one per core on the local runner, 1 "
        "elsewhere; 1: in the runner's own process).",
    )
    group.add_argument(
        "--read_threads",
        type=int,
        default=0,
        metavar="N",
        help="Threads per shard writer that read the next images (0: one per core in the "
        "runner's process; in a --write_processes worker, none for local files and 8 for "
        "bucket objects).",
    )


def validate(opts: ConvertOptions) -> None:
    """Checks option values that argparse cannot. Raises UserError naming the first bad one."""
    for bad, message in (
        (not opts.input, "--input is required (see `img2tfrecord convert --help`)"),
        (not opts.output_dir, "--output_dir is required (see `img2tfrecord convert --help`)"),
        (opts.shard_size_mb <= 0, "--shard_size_mb must be positive"),
        (opts.max_records_per_shard < 0, "--max_records_per_shard must be 0 (no limit) or positive"),
        (opts.num_shards < 0, "--num_shards must be 0 (size-based) or positive"),
        (opts.max_pixels <= 0, "--max_pixels must be positive"),
        (
            opts.stratify and opts.splits in ("", "folders"),
            "--stratify needs ratio splits (--splits train=0.8,...)",
        ),
        (
            opts.write_index and opts.compression != "none",
            "--write_index needs uncompressed shards (--compression none)",
        ),
        (not 0 <= opts.max_failure_ratio <= 1, "--max_failure_ratio must be between 0 and 1"),
        (opts.read_threads < 0, "--read_threads must be 0 (one per core) or positive"),
        (opts.write_processes < 0, "--write_processes must be 0 (automatic) or positive"),
        (opts.progress_interval <= 0, "--progress_interval must be positive"),
    ):
        if bad:
            raise UserError(message)
    try:
        encode_settings(opts)
        ratios = parse_split_ratios(opts.splits) if opts.splits not in ("", "folders") else ()
    except ValueError as e:
        raise UserError(str(e)) from None
    for name, _ in ratios:  # a split name becomes a file name prefix in --output_dir
        if name.startswith(".") or any(c in name for c in "/\\") or not name.isprintable():
            raise UserError(f"--splits: {name!r} cannot be part of a file name")
    _validate_label_flags(opts)
    validate_objects(opts, annotated=False)


def validate_objects(opts, annotated: bool) -> None:
    """Refuses, before the run, object flags that cannot be written correctly; `annotated`: the
    labels are annotations (boxes, masks, class maps). Raises UserError."""
    schema = PRESETS[opts.schema]
    if opts.masks and schema.name != "odapi":
        raise UserError(
            "--masks: instance masks are written as image/object/mask with --schema odapi "
            f"(the {opts.schema} schema has no mask key)"
        )
    if annotated and schema.objects is None:
        raise UserError(
            f"--schema {opts.schema} has no object keys: boxes are written with --schema odapi or tfds"
        )


# A Dataflow job label as Beam's own --labels takes it: key=value, lowercase, or a JSON object.
_JOB_LABEL = re.compile(r"[a-z][a-z0-9_-]*=[a-z0-9_-]*")


def is_job_label(value: str) -> bool:
    """True if a --labels value is a Dataflow job label rather than a labels table."""
    return bool(_JOB_LABEL.fullmatch(value)) or value.lstrip().startswith("{")


def route_labels_flag(argv: list[str]) -> list[str]:
    """Rewrites `--labels TABLE` to `--labels_path=TABLE`; job labels stay Beam's `--labels`
    (GoogleCloudOptions' Dataflow job labels, `key=value`, appended by schedulers such as
    Airflow's Beam operator)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--labels" and not is_job_label(arg):
            out[-1] = "--labels_path=" + arg
        elif arg.startswith("--labels=") and not is_job_label(arg.removeprefix("--labels=")):
            out.append("--labels_path=" + arg.removeprefix("--labels="))
        else:
            out.append(arg)
    return out


# What --labels names besides a table: annotation files whose format the files tell (checks.py).
AUTO = "auto"


def labels_kind(opts) -> str:
    """What --labels names: '' (nothing: class folders), 'webdataset', 'table', an annotation
    format (ANNOTATION_FORMATS), or AUTO: annotations whose format the files will tell
    (a folder, glob or prefix under --labels_format auto; checks.check_annotations looks)."""
    path, chosen = opts.labels_path, opts.labels_format
    if not path or path == WEBDATASET:
        return path
    if chosen in ANNOTATION_FORMATS:
        return chosen
    if chosen in FORMATS:
        return "table"
    if path.lower().endswith(".json"):
        return COCO
    try:
        detect_format(path)
    except ValueError:
        return AUTO
    return "table"


def _validate_label_flags(opts: ConvertOptions) -> None:
    table_only = ("label_map", "split_column", "extra_columns", "box_columns")
    if not opts.labels_path:
        for name in table_only:
            if getattr(opts, name):
                raise UserError(f"--{name} needs --labels (a labels table)")
        return
    if opts.split_column and opts.splits:
        raise UserError("--split_column and --splits are exclusive: the split comes from one place")
    if opts.label_map and opts.label_type == "int":
        raise UserError("--label_map names the classes; it cannot be combined with --label_type int")
    if opts.box_units != "pixels" and not opts.box_columns:
        raise UserError("--box_units applies to a table of boxes: name its columns with --box_columns")
    kind = labels_kind(opts)
    if kind == WEBDATASET or kind in ANNOTATION_FORMATS or kind == AUTO:
        what = f"--labels {WEBDATASET}" if kind == WEBDATASET else "annotation files"
        for name in ("split_column", "extra_columns", "box_columns"):
            if getattr(opts, name):
                raise UserError(f"--{name} needs a labels table, not {what}")
        validate_annotation_flags(opts, kind)
        return
    try:
        extras = parse_extra_columns(opts.extra_columns)
        boxes = parse_box_columns(opts.box_columns) if opts.box_columns else ()
        codecs.lookup(opts.labels_encoding)
    except LookupError:
        raise UserError(
            f"--labels_encoding {opts.labels_encoding}: no such text encoding (cp949, latin-1, utf-16, ...)"
        ) from None
    except ValueError as e:
        raise UserError(str(e)) from None
    if len(opts.labels_delimiter) > 1 or opts.labels_delimiter in ('"', "\n", "\r"):
        raise UserError("--labels_delimiter must be one character other than a quote or a line break")
    reserved = {opts.key_column, opts.label_column, opts.split_column}
    for name, _ in extras:
        if name in reserved:
            raise UserError(f"--extra_columns: {name!r} is already the key, label or split column")
        if name in SLIM.kinds:
            raise UserError(f"--extra_columns: {name!r} would overwrite a feature of the schema")
    taken = reserved | {name for name, _ in extras}
    for name in boxes:
        if name in taken:
            raise UserError(f"--box_columns: {name!r} is already the key, label, split or an extra column")


def validate_annotation_flags(opts, kind: str) -> None:
    """The --label_map rules of annotation formats: a COCO file names its classes, YOLO
    files hold class indices that --label_map names."""
    if kind == COCO and opts.label_map:
        raise UserError("--label_map: a COCO file names its classes (its categories); leave --label_map out")
    if kind == YOLO and not opts.label_map:
        raise UserError(
            "--labels_format yolo needs --label_map: the class names, a file of one a line (classes.txt) "
            "or the dataset's data.yaml"
        )
