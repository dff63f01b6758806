"""The CLI's help texts: the verb list, `convert --help` in groups, `--help_all`, `--version`.

`convert --help` shows ConvertOptions' argparse groups, each flag with its default, and leaves
the local-runner group and Beam's own options (~900 lines: they would bury ours) to
`convert --help_all`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from importlib import metadata

# The verbs, in the order `img2tfrecord --help` lists them, with their one-line summary.
VERBS = {
    "convert": "Convert an image folder (local or gs://) into sharded TFRecords (the default verb).",
    "verify": "Check that every shard of a converted dataset is readable and complete.",
    "inspect": "Print records per split and class; --report writes an HTML page with samples.",
    "demo": "Generate a small image folder and convert it (no download).",
}


def prog_name() -> str:
    """How the user called us: `img2tfrecord`, or `python -m beam_pipeline` (not `__main__.py`)."""
    base = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if base in ("__main__.py", "-m", "") or base.startswith("python"):
        return "python -m beam_pipeline"
    return "img2tfrecord"


def version() -> str:
    """The installed package's version (package metadata), or 'unknown' when not installed."""
    try:
        return metadata.version("img2tfrecord")
    except metadata.PackageNotFoundError:
        return "unknown"


def top_help(prog: str) -> str:
    """`img2tfrecord --help`: what it is, the verbs with one line each, where to go next."""
    commands = "\n".join(f"  {verb:<7}  {text}" for verb, text in VERBS.items())
    return f"""usage: {prog} <command> [flags]

Turn image folders (local or gs://) into sharded TFRecords of tf.train.Example, with Apache Beam.

commands:
{commands}

options:
  -h, --help  show this help and exit
  --version   show the version and exit

`{prog} <command> --help` shows a command's flags; with no command, flags go to convert:
  {prog} --input ./flowers --output_dir ./out
"""


class Formatter(argparse.HelpFormatter):
    """argparse's layout at the terminal's width (80 at most), each flag's default after its
    help: off/on for switches, '' for an empty string, none when it is None (a required flag,
    or one that does nothing unless given: its help says what it needs)."""

    def __init__(self, prog: str):
        width = max(60, min(shutil.get_terminal_size().columns, 80)) - 2
        super().__init__(prog, max_help_position=28, width=width)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        default = action.default
        shown = "off" if default is False else "on" if default is True else str(default) or "''"
        return f"{text} (default: {shown})".strip().replace("%", "%%")


def convert_help(prog: str, everything: bool = False) -> str:
    """`convert --help` (without the local-runner group and Beam's options) or `--help_all`."""
    from beam_pipeline.cli import options

    hidden = "" if everything else "; --help_all adds the local runner's flags and Beam's"
    parser = argparse.ArgumentParser(
        prog=f"{prog} convert",
        usage=f"{prog} convert --input PATH --output_dir PATH [flags]",
        description="Convert images (one sub-folder per class, or a labels table) into sharded "
        "TFRecords, labels.txt, summary.json, failures.jsonl and TFDS metadata.",
        epilog=f"Any Apache Beam pipeline option is accepted too (--runner, --project, --region, "
        f"--temp_location, ...){hidden}.",
        formatter_class=Formatter,
    )
    parser.add_argument(
        "--help_all", action="store_true", default=argparse.SUPPRESS, help="Every flag, and Beam's options."
    )
    options.add_flags(parser, labels_flag="--labels", local_runner=everything)
    text = parser.format_help()
    return text + "\n" + beam_help(prog) if everything else text


def beam_help(prog: str) -> str:
    """Every Beam pipeline option (Beam's own help, ~900 lines), for `convert --help_all`."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipeline.cli.options import ConvertOptions

    parser = argparse.ArgumentParser(
        prog=f"{prog} convert",
        usage=argparse.SUPPRESS,
        description="Apache Beam pipeline options accepted by convert (and verify --beam):",
        add_help=False,
    )
    seen: set[str] = set()
    for cls in PipelineOptions.__subclasses__():
        if cls is ConvertOptions or cls.__name__ in seen:
            continue
        seen.add(cls.__name__)
        try:
            cls._add_argparse_args(parser.add_argument_group(cls.__name__))
        except argparse.ArgumentError:  # a flag defined by two Beam classes
            continue
    return parser.format_help()
