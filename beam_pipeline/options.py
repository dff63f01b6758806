"""ConvertOptions: the converter's own flags, parsed next to every Beam pipeline option."""

from __future__ import annotations

import argparse

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from transforms.image import DEFAULT_MAX_PIXELS
from transforms.layout import DEFAULT_SEED, DEFAULT_SHARD_SIZE_MB, parse_split_ratios
from transforms.write import COMPRESSIONS


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
        parser.add_argument("--quiet", action="store_true", help="No progress output.")
        parser.add_argument(
            "--read_threads",
            type=int,
            default=0,
            help="Threads per shard writer that read and check the next images (0: one per core).",
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
        raise UserError("--input is required")
    if not opts.output_dir:
        raise UserError("--output_dir is required")
    if opts.shard_size_mb <= 0:
        raise UserError("--shard_size_mb must be positive")
    if opts.num_shards < 0:
        raise UserError("--num_shards must be 0 (size-based) or positive")
    if opts.max_pixels <= 0:
        raise UserError("--max_pixels must be positive")
    if opts.read_threads < 0:
        raise UserError("--read_threads must be 0 (one per core) or positive")
    if opts.progress_interval <= 0:
        raise UserError("--progress_interval must be positive")
    if opts.splits and opts.splits != "folders":
        try:
            parse_split_ratios(opts.splits)
        except ValueError as e:
            raise UserError(str(e)) from None


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
