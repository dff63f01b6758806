"""ConvertOptions: the converter's own flags, parsed next to every Beam pipeline option."""

from __future__ import annotations

import argparse
import re

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.cli.image_options import add_image_arguments, encode_settings
from transforms.encoding.schema import SLIM
from transforms.images.types import DEFAULT_MAX_PIXELS
from transforms.labels.beam_webdataset import WEBDATASET
from transforms.labels.rows import (
    DUPLICATE_POLICIES,
    FORMATS,
    IMAGE_KEYS,
    LABEL_TYPES,
    UNLABELED_POLICIES,
    JoinSettings,
    TableSpec,
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


# The group of the flags that runs on the local runner rarely need: `convert --help` leaves it
# to `--help_all` (beam_pipeline/cli/help.py).
LOCAL_RUNNER_GROUP = "local runner"


class ConvertOptions(PipelineOptions):
    """Options of `img2tfrecord convert`, in the groups `convert --help` shows them in.

    Each flag's default is printed by the help (beam_pipeline/cli/help.py), so the texts do
    not repeat it. `--labels_path` is shown and documented as `--labels` (route_labels_flag).
    """

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("input")
        group.add_argument("--input", metavar="PATH", help="Required: images (folder, gs:// prefix, tars).")
        group.add_argument("--dedupe", action="store_true", help="Drop byte-identical duplicates.")
        group.add_argument(
            "--max_pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="N", help="Larger images fail."
        )

        group = parser.add_argument_group("labels")
        group.add_argument(
            "--labels_path",
            default="",
            metavar="PATH",
            help="Labels table (CSV, TSV, JSON Lines; local, gs://, a glob) or 'webdataset'; "
            "'': class folders.",
        )
        group.add_argument(
            "--labels_format", choices=("auto",) + FORMATS, default="auto", help="auto: from the extension."
        )
        group.add_argument("--key_column", default="id", metavar="COL", help="Column of the image key.")
        group.add_argument("--label_column", default="label", metavar="COL", help="Column of the label(s).")
        group.add_argument(
            "--image_key",
            choices=IMAGE_KEYS,
            default="stem",
            help="What the key column holds: file stem, file name or path in --input.",
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
        group.add_argument(
            "--label_offset", type=int, choices=(0, 1), default=0, help="Id of the first class."
        )

        group = parser.add_argument_group("splits and shards")
        group.add_argument(
            "--splits",
            default="",
            metavar="SPEC",
            help="'folders' (<split>/<class>/...) or ratios 'train=0.8,validation=0.2' by a "
            "seeded hash of each path. Empty: all 'train'.",
        )
        group.add_argument(
            "--split_column", default="", metavar="COL", help="Labels table column of the split."
        )
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

        add_image_arguments(parser.add_argument_group("images and schema"))

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
    """Checks option values that argparse cannot. Raises UserError."""
    if not opts.input:
        raise UserError("--input is required (see `img2tfrecord convert --help`)")
    if not opts.output_dir:
        raise UserError("--output_dir is required (see `img2tfrecord convert --help`)")
    if opts.shard_size_mb <= 0:
        raise UserError("--shard_size_mb must be positive")
    if opts.max_records_per_shard < 0:
        raise UserError("--max_records_per_shard must be 0 (no limit) or positive")
    if opts.num_shards < 0:
        raise UserError("--num_shards must be 0 (size-based) or positive")
    if opts.max_pixels <= 0:
        raise UserError("--max_pixels must be positive")
    if opts.stratify and opts.splits in ("", "folders"):
        raise UserError("--stratify needs ratio splits (--splits train=0.8,...)")
    try:
        encode_settings(opts)
    except ValueError as e:
        raise UserError(str(e)) from None
    if opts.write_index and opts.compression != "none":
        raise UserError("--write_index needs uncompressed shards (--compression none)")
    if not 0 <= opts.max_failure_ratio <= 1:
        raise UserError("--max_failure_ratio must be between 0 and 1")
    if opts.read_threads < 0:
        raise UserError("--read_threads must be 0 (one per core) or positive")
    if opts.write_processes < 0:
        raise UserError("--write_processes must be 0 (automatic) or positive")
    if opts.progress_interval <= 0:
        raise UserError("--progress_interval must be positive")
    if opts.splits and opts.splits != "folders":
        try:
            ratios = parse_split_ratios(opts.splits)
        except ValueError as e:
            raise UserError(str(e)) from None
        for name, _ in ratios:
            # A split name becomes a file name prefix in --output_dir.
            if name.startswith(".") or any(c in name for c in "/\\") or not name.isprintable():
                raise UserError(f"--splits: {name!r} cannot be part of a file name")
    _validate_label_flags(opts)


# A Dataflow job label as Beam's own --labels takes it: key=value, lowercase, or a JSON object.
_JOB_LABEL = re.compile(r"[a-z][a-z0-9_-]*=[a-z0-9_-]*")


def is_job_label(value: str) -> bool:
    """True if a --labels value is a Dataflow job label rather than a labels table."""
    return bool(_JOB_LABEL.fullmatch(value)) or value.lstrip().startswith("{")


def route_labels_flag(argv: list[str]) -> list[str]:
    """Rewrites `--labels TABLE` to `--labels_path=TABLE`; job labels stay Beam's `--labels`.

    Beam's GoogleCloudOptions owns `--labels` (Dataflow job labels, `key=value`, appended by
    schedulers such as Airflow's Beam operator). A value that looks like one passes through
    unchanged; anything else (a path: it has '/' or '.') is our labels table.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--labels" and i + 1 < len(argv) and not is_job_label(argv[i + 1]):
            out.append("--labels_path=" + argv[i + 1])
            i += 2
            continue
        if arg.startswith("--labels=") and not is_job_label(arg[len("--labels=") :]):
            out.append("--labels_path=" + arg[len("--labels=") :])
        else:
            out.append(arg)
        i += 1
    return out


def _validate_label_flags(opts: ConvertOptions) -> None:
    table_only = ("label_map", "split_column", "extra_columns")
    if not opts.labels_path:
        for name in table_only:
            if getattr(opts, name):
                raise UserError(f"--{name} needs --labels (a labels table)")
        return
    if opts.split_column and opts.splits:
        raise UserError("--split_column and --splits are exclusive: the split comes from one place")
    if opts.label_map and opts.label_type == "int":
        raise UserError("--label_map names the classes; it cannot be combined with --label_type int")
    if opts.labels_path == WEBDATASET:
        for name in ("split_column", "extra_columns"):
            if getattr(opts, name):
                raise UserError(f"--{name} needs a labels table, not --labels {WEBDATASET}")
        return
    try:
        detect_format(opts.labels_path, opts.labels_format)
        extras = parse_extra_columns(opts.extra_columns)
    except ValueError as e:
        raise UserError(str(e)) from None
    reserved = {opts.key_column, opts.label_column, opts.split_column}
    for name, _ in extras:
        if name in reserved:
            raise UserError(f"--extra_columns: {name!r} is already the key, label or split column")
        if name in SLIM.kinds:
            raise UserError(f"--extra_columns: {name!r} would overwrite a feature of the schema")


def table_spec(opts: ConvertOptions) -> TableSpec:
    """The labels table described by the options (call after validate)."""
    webdataset = opts.labels_path == WEBDATASET
    return TableSpec(
        path=opts.labels_path,
        format=WEBDATASET if webdataset else detect_format(opts.labels_path, opts.labels_format),
        key_column=opts.key_column,
        label_column=opts.label_column,
        separator=opts.label_separator,
        split_column=opts.split_column,
        extra_columns=parse_extra_columns(opts.extra_columns),
    )


def join_settings(opts: ConvertOptions) -> JoinSettings:
    """How table rows label images, from the options (--label_map's names reach the join as a
    side input: JoinLabels' `label_map`)."""
    return JoinSettings(
        unlabeled=opts.unlabeled,
        duplicates=opts.duplicate_keys,
        label_type="str" if opts.label_map else opts.label_type,
        split_from_folders=opts.splits == "folders",
    )


def _usage_error(message: str):
    raise UserError(message)


def check_args(argv: list[str]) -> None:
    """Rejects flags that neither ConvertOptions nor any Beam options class knows, and bad values.

    Beam itself only warns about (and drops) unknown flags; a misspelt `--ouput_dir`
    must be an error here. Beam's own parser of every options class (handed to
    `add_extra_args_fn`) parses `argv`, its usage errors raised as UserError.
    """

    def strict(parser: argparse.ArgumentParser) -> None:
        parser.error = _usage_error
        _, unknown = parser.parse_known_args(argv)
        flags = [a for a in unknown if a.startswith("-")]
        if flags:
            raise UserError(f"unrecognized arguments: {' '.join(flags)}")

    PipelineOptions(argv).get_all_options(add_extra_args_fn=strict)
