"""ConvertOptions: the converter's own flags, parsed next to every Beam pipeline option."""

from __future__ import annotations

import argparse
import re

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

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


class ConvertOptions(PipelineOptions):
    """Options of `img2tfrecord convert`."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--input", help="Folder (local or gs://) with one sub-folder per class.")
        parser.add_argument("--output_dir", help="Where shards and metadata are written.")
        parser.add_argument(
            "--splits",
            default="",
            help="'folders' (first folder level is the split), or ratios such as "
            "'train=0.8,validation=0.1,test=0.1' assigned by a seeded hash of each path. "
            "Empty: everything is 'train'.",
        )
        parser.add_argument(
            "--stratify",
            action="store_true",
            help="With ratio splits: keep each class's ratio in every split.",
        )
        parser.add_argument(
            "--seed", type=int, default=DEFAULT_SEED, help="Seed of the shuffle and split hash."
        )
        parser.add_argument(
            "--shard_size_mb",
            type=float,
            default=DEFAULT_SHARD_SIZE_MB,
            help="Target shard size in MB.",
        )
        parser.add_argument(
            "--num_shards", type=int, default=0, help="Shards per split; overrides --shard_size_mb."
        )
        parser.add_argument(
            "--max_records_per_shard",
            type=int,
            default=DEFAULT_MAX_RECORDS_PER_SHARD,
            help="With --shard_size_mb: about this many images a shard at most (shards of tiny images "
            "are smaller than the size; bounds what one worker holds). 0: no limit.",
        )
        parser.add_argument(
            "--compression",
            choices=sorted(COMPRESSIONS),
            default="none",
            help="gzip: write .tfrecord.gz shards (readers pass compression_type='GZIP').",
        )
        parser.add_argument(
            "--label_offset", type=int, choices=(0, 1), default=0, help="Id of the first class."
        )
        parser.add_argument(
            "--max_pixels", type=int, default=DEFAULT_MAX_PIXELS, help="Larger images are failures."
        )
        parser.add_argument(
            "--overwrite", action="store_true", help="Replace an existing dataset in --output_dir."
        )
        parser.add_argument(
            "--max_failure_ratio",
            type=float,
            default=DEFAULT_MAX_FAILURE_RATIO,
            help="Fail the job (exit 3, no dataset written) when more than this fraction of the "
            "listed images fail; failures.jsonl is still written.",
        )
        parser.add_argument(
            "--dataset_name",
            default="",
            help="Dataset name in the TFDS metadata; empty: the input folder's name.",
        )
        parser.add_argument("--quiet", action="store_true", help="No progress output.")
        add_image_arguments(parser)
        parser.add_argument(
            "--write_index",
            action="store_true",
            help="Write <shard>.idx files (offset length per record) for DALI / PyTorch tfrecord.",
        )
        # Labels from a table (see route_labels_flag for how --labels reaches --labels_path).
        parser.add_argument(
            "--labels_path",
            default="",
            help="Labels table (CSV, TSV or JSON Lines; local, gs:// or a glob), or 'webdataset': "
            "labels from the .cls/.txt/.json sidecars of WebDataset samples in tar archives. "
            "Also --labels PATH.",
        )
        parser.add_argument(
            "--labels_format",
            choices=("auto",) + FORMATS,
            default="auto",
            help="Format of the labels table; auto: from its extension.",
        )
        parser.add_argument("--key_column", default="id", help="Column of the image key.")
        parser.add_argument("--label_column", default="label", help="Column of the label(s).")
        parser.add_argument(
            "--image_key",
            choices=IMAGE_KEYS,
            default="stem",
            help="How an image is keyed: file stem, file name, or path relative to --input.",
        )
        parser.add_argument(
            "--label_separator", default="|", help="Splits one label cell into several labels."
        )
        parser.add_argument(
            "--label_type",
            choices=LABEL_TYPES,
            default="auto",
            help="int: labels are class ids as given; str: names mapped to ids; auto: int if all are.",
        )
        parser.add_argument(
            "--label_map",
            default="",
            help="Class names: a file of names in id order (one a line), or a .csv/.tsv of id,name "
            "(e.g. GLDv2's train_label_to_category.csv). Table labels may be names or ids of it.",
        )
        parser.add_argument(
            "--extra_columns", default="", help="Columns carried as features: name:int|float|str,..."
        )
        parser.add_argument("--split_column", default="", help="Column holding each image's split.")
        parser.add_argument(
            "--unlabeled",
            choices=UNLABELED_POLICIES,
            default="fail",
            help="Images without a label row: fail (listed in failures.jsonl), skip (counted) or keep.",
        )
        parser.add_argument(
            "--duplicate_keys",
            choices=DUPLICATE_POLICIES,
            default="fail",
            help="Rows of one key that disagree: fail, first (first row wins) or union (multi-label).",
        )
        parser.add_argument(
            "--read_threads",
            type=int,
            default=0,
            help="Threads per shard writer that read and check the next images (0: one per core "
            "in the runner's process; in a --write_processes worker, none for local files, which "
            "the kernel reads ahead, and 8 that read bucket objects ahead).",
        )
        parser.add_argument(
            "--write_processes",
            type=int,
            default=0,
            help="Worker processes that write whole shards at once (0: one per core on the local "
            "runner, 1 elsewhere; 1: shards are written in the runner's own process).",
        )
        parser.add_argument(
            "--progress_interval",
            type=float,
            default=10.0,
            help="Seconds between progress lines when stderr is not a terminal.",
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


class _StrictParser(_BeamArgumentParser):
    def error(self, message: str):
        raise UserError(message)


def check_args(argv: list[str]) -> None:
    """Rejects flags that neither ConvertOptions nor any Beam options class knows.

    Beam itself only warns about (and drops) unknown flags; a misspelt `--ouput_dir`
    must be an error here.
    """
    parser = _StrictParser(allow_abbrev=False)
    subset: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(argv)
    flags = [a for a in unknown if a.startswith("-")]
    if flags:
        raise UserError(f"unrecognized arguments: {' '.join(flags)}")
