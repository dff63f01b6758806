"""The CLI's help texts: the verb list, `convert --help` in groups, `--help_beam`, `--version`.

In: ConvertOptions' argparse actions (beam_pipeline/cli/options.py, image_options.py). Out:
text for stdout. `convert --help` shows our flags first, grouped by what they are about,
each with its default, then one line pointing at Beam's own options, which `--help_beam`
lists (Beam's help is ~900 lines: it would bury ours). A flag that no group names (one
added later) lands in the last group, "other", so every flag is always shown.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.cli.options import ConvertOptions

# The verbs, in the order `img2tfrecord --help` lists them, with their one-line summary.
VERBS = {
    "convert": "Convert an image folder (local or gs://) into sharded TFRecords (the default verb).",
    "verify": "Check that every shard of a converted dataset is readable and complete.",
    "inspect": "Print records per split and class; --report writes an HTML page with samples.",
    "demo": "Generate a small image folder and convert it (no download).",
}

# `convert --help`: group title -> flags (dest names), in the order shown.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input", ("input", "dedupe", "max_pixels")),
    (
        "labels",
        (
            "labels_path",
            "labels_format",
            "key_column",
            "label_column",
            "image_key",
            "label_separator",
            "label_type",
            "label_map",
            "extra_columns",
            "unlabeled",
            "duplicate_keys",
            "label_offset",
        ),
    ),
    (
        "splits and shards",
        (
            "splits",
            "split_column",
            "stratify",
            "seed",
            "shard_size_mb",
            "max_records_per_shard",
            "num_shards",
        ),
    ),
    (
        "images and schema",
        (
            "image_format",
            "jpeg_quality",
            "resize",
            "max_side",
            "resize_mode",
            "color",
            "exif_transpose",
            "store",
            "schema",
            "rename_keys",
        ),
    ),
    (
        "output and reliability",
        (
            "output_dir",
            "overwrite",
            "compression",
            "write_index",
            "dataset_name",
            "max_failure_ratio",
            "quiet",
            "progress_interval",
        ),
    ),
    ("local runner", ("write_processes", "read_threads")),
)
OTHER_GROUP = "other"
REQUIRED = ("input", "output_dir")

BEAM_LINE = (
    "Any Apache Beam pipeline option is accepted too (--runner, --project, --region, "
    "--temp_location, --direct_num_workers, ...); `{prog} convert --help_beam` lists them all."
)


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
    width = max(len(v) for v in VERBS)
    lines = [
        f"usage: {prog} <command> [flags]",
        "",
        "Turn image folders (local or gs://) into sharded TFRecords of tf.train.Example, with Apache Beam.",
        "",
        "commands:",
        *(f"  {verb:<{width}}  {text}" for verb, text in VERBS.items()),
        "",
        "options:",
        "  -h, --help  show this help and exit",
        "  --version   show the version and exit",
        "",
        f"`{prog} <command> --help` shows a command's flags; with no command, flags go to convert:",
        f"  {prog} --input ./flowers --output_dir ./out",
    ]
    return "\n".join(lines) + "\n"


def _value(value: object) -> str:
    if value is None or value == "":
        return "''"
    if value is False:
        return "off"
    if value is True:
        return "on"
    return str(value)


def default_text(action: argparse.Action) -> str:
    """How `convert --help` spells a flag's default."""
    if action.dest in REQUIRED:
        return "required"
    return "default: " + _value(action.default)


class _Formatter(argparse.HelpFormatter):
    """argparse's layout at the terminal's width, with a wider flag column."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=30, width=_terminal_width())


def _with_default(action: argparse.Action) -> str:
    """The flag's help text followed by its default (or 'required'), also for flags without help."""
    text = (action.help or "").strip()
    suffix = f"({default_text(action)})".replace("%", "%%")
    return f"{text} {suffix}" if text else suffix


def _terminal_width() -> int:
    try:
        columns = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = int(os.environ.get("COLUMNS", "100") or 100)
    return max(60, min(columns, 120)) - 2


def convert_parser(prog: str) -> argparse.ArgumentParser:
    """A help-only parser holding ConvertOptions' flags in GROUPS (unknown flags in 'other')."""
    source = argparse.ArgumentParser(add_help=False)
    ConvertOptions._add_argparse_args(source)
    actions = {a.dest: a for a in source._actions}
    parser = argparse.ArgumentParser(
        prog=f"{prog} convert",
        usage=f"{prog} convert --input DIR --output_dir DIR [flags] [beam pipeline options]",
        description="Convert an image folder (one sub-folder per class, or a labels table) into "
        "sharded TFRecords, plus labels.txt, summary.json, failures.jsonl and TFDS metadata.",
        epilog=BEAM_LINE.format(prog=prog),
        formatter_class=_Formatter,
        add_help=False,
    )
    parser.add_argument("-h", "--help", action="help", help="show this help and exit")
    parser.add_argument("--help_beam", action="store_true", help="list every Beam pipeline option and exit")
    for action in actions.values():
        action.help = _with_default(action)
    placed: set[str] = set()
    for title, dests in GROUPS:
        group = parser.add_argument_group(title)
        for dest in dests:
            if dest in actions:
                group._add_action(actions[dest])
                placed.add(dest)
    rest = [a for dest, a in actions.items() if dest not in placed]
    if rest:
        group = parser.add_argument_group(OTHER_GROUP)
        for action in rest:
            group._add_action(action)
    return parser


def convert_help(prog: str) -> str:
    """`convert --help`: our flags in groups, defaults shown, then the line about Beam's options."""
    return convert_parser(prog).format_help()


def beam_help(prog: str) -> str:
    """`convert --help_beam`: every Beam pipeline option (Beam's own help, ~900 lines)."""
    parser = argparse.ArgumentParser(
        prog=f"{prog} convert",
        usage=f"{prog} convert [flags] [beam pipeline options]",
        description="Apache Beam pipeline options accepted by convert (and verify --beam).",
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
