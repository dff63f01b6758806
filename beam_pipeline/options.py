"""ConvertOptions: the converter's own flags, parsed next to every Beam pipeline option."""

from __future__ import annotations

import argparse

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from beam_pipeline.image_options import add_image_arguments, encode_settings
from transforms.image import DEFAULT_MAX_PIXELS
from transforms.layout import DEFAULT_SEED, DEFAULT_SHARD_SIZE_MB, parse_split_ratios
from transforms.write import COMPRESSIONS

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
        parser.add_argument("--compression", choices=sorted(COMPRESSIONS), default="none")
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
            help="Dataset name in the TFDS metadata (default: the input folder's name).",
        )
        parser.add_argument("--quiet", action="store_true", help="No progress output.")
        add_image_arguments(parser)
        parser.add_argument(
            "--write_index",
            action="store_true",
            help="Write <shard>.idx files (offset length per record) for DALI / PyTorch tfrecord.",
        )


def validate(opts: ConvertOptions) -> None:
    """Checks option values that argparse cannot. Raises UserError."""
    if not opts.input:
        raise UserError("--input is required")
    if not opts.output_dir:
        raise UserError("--output_dir is required")
    if opts.shard_size_mb <= 0:
        raise UserError("--shard_size_mb must be positive")
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
    if opts.splits and opts.splits != "folders":
        try:
            ratios = parse_split_ratios(opts.splits)
        except ValueError as e:
            raise UserError(str(e)) from None
        for name, _ in ratios:
            # A split name becomes a file name prefix in --output_dir.
            if name.startswith(".") or any(c in name for c in "/\\") or not name.isprintable():
                raise UserError(f"--splits: {name!r} cannot be part of a file name")


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
