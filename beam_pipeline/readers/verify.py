"""`img2tfrecord verify OUTPUT_DIR`: is every shard of a converted dataset readable and complete?

Reads every record (framing, both CRCs), parses each Example with the dataset's schema, decodes
a sample of the images (`--all`: every one) as its readers do, compares the index files, and
the record and shard counts with summary.json and dataset_info.json. Exit 0 when all is well,
1 naming the first bad shard and byte offset, 2 for a usage error. With `--beam` (or any Beam
flag) a Beam pipeline checks one shard an element and writes `OUTPUT_DIR/verify.json`.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from collections.abc import Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.cli.argv import check_args
from beam_pipeline.cli.help import Formatter, prog_name
from beam_pipeline.cli.options import UserError
from transforms import gcs
from transforms.encoding.dataset_format import DatasetFormat
from transforms.output.publish import LABELS_FILE, MARKER_FILE, SUMMARY_FILE, folder_exists
from transforms.output.tfds import DATASET_INFO_FILE, FEATURES_FILE
from transforms.paths import normalize_root
from transforms.verify.beam import VerifyShards
from transforms.verify.shards import ShardCheck, check_shard
from transforms.writing.files import read_file

VERIFY_RESULTS_FILE = "verify.json"
_SHARD_NAME = re.compile(r"^(?P<split>.+)-(?P<index>\d{5,})-of-(?P<count>\d{5,})\.tfrecord(\.gz)?$")


def _shard_name(path: str) -> re.Match | None:
    return _SHARD_NAME.match(path.rsplit("/", 1)[-1])


def load_summary(output_dir: str) -> dict:
    """summary.json of `output_dir`. Raises UserError when it is not a finished dataset (no
    summary.json, or the in-progress marker next to it: a run is writing the folder, or was
    interrupted there) or cannot be read (the error named: a store that does not answer, no
    permission)."""
    path = FileSystems.join(output_dir, SUMMARY_FILE)
    try:
        if gcs.exists(FileSystems.join(output_dir, MARKER_FILE)):
            raise UserError(
                f"{output_dir}: not a finished img2tfrecord dataset: {MARKER_FILE} is there (a run is writing "
                "it, or was interrupted there: its files may be a mix of two runs); wait for the run to "
                "end, or rerun the conversion"
            )
        if not gcs.exists(path):
            if not folder_exists(output_dir):
                raise UserError(f"{output_dir}: no such folder")
            raise UserError(f"{output_dir}: no {SUMMARY_FILE} (not a finished img2tfrecord dataset)")
        return json.loads(read_file(path).decode("utf-8"))
    except OSError as e:
        if not folder_exists(output_dir):
            raise UserError(f"{output_dir}: no such folder") from None
        raise UserError(f"{path}: cannot read it: {e}") from None
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


def load_class_names(output_dir: str) -> list[str]:
    """The class names of a dataset in id order: labels.txt, one a line (none if it has none)."""
    path = FileSystems.join(output_dir, LABELS_FILE)
    if not FileSystems.exists(path):
        return []
    return read_file(path).decode("utf-8").split("\n")[:-1]


def load_format(output_dir: str, summary: dict) -> DatasetFormat:
    """How the dataset's records are parsed and decoded (summary.json, and features.json if any).

    Raises:
      UserError: summary.json names an unknown schema or store mode, or features.json is not JSON.
    """
    features = None
    path = FileSystems.join(output_dir, FEATURES_FILE)
    if FileSystems.exists(path):
        try:
            features = json.loads(read_file(path).decode("utf-8"))
        except ValueError as e:
            raise UserError(f"{path}: not valid JSON ({e})") from None
    try:
        return DatasetFormat.from_summary(summary, features)
    except ValueError as e:
        raise UserError(f"{output_dir}: {e}") from None


def list_shards(output_dir: str) -> dict[str, list[str]]:
    """split -> shard paths (sorted) found in `output_dir`."""
    found = FileSystems.match([FileSystems.join(output_dir, "*-?????-of-?????.tfrecord*")])[0].metadata_list
    by_split: dict[str, list[str]] = collections.defaultdict(list)
    for m in found:
        if match := _shard_name(m.path):
            by_split[match["split"]].append(m.path)
    return {s: sorted(p) for s, p in sorted(by_split.items())}


def check_layout(shards: dict[str, list[str]], summary: dict) -> list[str]:
    """Problems with the set of shards: missing shards, names, counts vs. the summary."""
    problems = []
    expected = summary.get("splits", {})
    for split, info in expected.items():
        if info.get("written", 0) and split not in shards:
            problems.append(
                f"split {split!r}: summary.json lists {info['written']} records but no shards exist"
            )
    for split, paths in shards.items():
        names = [_shard_name(p) for p in paths]
        counts = {int(m["count"]) for m in names}
        indices = sorted(int(m["index"]) for m in names)
        if counts != {len(paths)} or indices != list(range(len(paths))):
            problems.append(f"split {split!r}: shard files {indices} do not form 0..N-1 of {sorted(counts)}")
        want = expected.get(split, {}).get("shards")
        if want is not None and want != len(paths):
            problems.append(f"split {split!r}: {len(paths)} shards, summary.json says {want}")
        if split not in expected:
            problems.append(f"split {split!r}: shards exist but summary.json does not list the split")
    return problems


def check_counts(checks: list[ShardCheck], summary: dict, tfds_info: dict | None) -> list[str]:
    """Record counts per split (and per shard, from dataset_info.json) vs. what was read."""
    problems = []
    per_split: collections.Counter = collections.Counter()
    per_shard: dict[str, int] = {}
    for c in checks:
        per_split[_shard_name(c.path)["split"]] += c.records
        per_shard[c.path] = c.records
    for split, info in summary.get("splits", {}).items():
        if per_split[split] != info.get("written", 0):
            problems.append(
                f"split {split!r}: {per_split[split]} records, summary.json says {info.get('written')}"
            )
    for entry in (tfds_info or {}).get("splits", []):
        lengths = [int(n) for n in entry.get("shardLengths", [])]
        paths = sorted(p for p in per_shard if p.rsplit("/", 1)[-1].startswith(entry["name"] + "-"))
        got = [per_shard[p] for p in paths]
        if got != lengths:
            problems.append(
                f"split {entry['name']!r}: shard lengths {got}, {DATASET_INFO_FILE} says {lengths}"
            )
    return problems


def _write_results(checks: Iterable[ShardCheck], path: str) -> None:
    text = "".join(c.to_json() + "\n" for c in sorted(checks, key=lambda c: c.path))
    with FileSystems.create(path, mime_type="application/json") as f:
        f.write(text.encode("utf-8"))


def _check_with_beam(
    paths: list[str], check: VerifyShards, output_dir: str, beam_args: list[str]
) -> list[ShardCheck]:
    from beam_pipeline.cli.local_runner import local_defaults

    options = PipelineOptions(beam_args)
    local_defaults(options, beam_args)
    results = FileSystems.join(output_dir, VERIFY_RESULTS_FILE)
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | "ListShards" >> beam.Create(paths)  # shard path
            | "VerifyShards" >> check  # ShardCheck
            | "Collect" >> beam.combiners.ToList()  # [ShardCheck]
            | "WriteResults" >> beam.Map(_write_results, results)
        )
    return [ShardCheck.from_json(line) for line in read_file(results).decode("utf-8").splitlines()]


def verify(
    output_dir: str, *, decode_all: bool = False, use_beam: bool = False, beam_args: list[str] = ()
) -> tuple[list[ShardCheck], list[str]]:
    """Checks a dataset. Returns (per-shard results, problems); no problems means valid.

    Raises:
      UserError: `output_dir` is not a finished dataset.
    """
    output_dir = normalize_root(output_dir)
    summary = load_summary(output_dir)
    fmt = load_format(output_dir, summary)
    info_path = FileSystems.join(output_dir, DATASET_INFO_FILE)
    tfds_info = json.loads(read_file(info_path).decode("utf-8")) if FileSystems.exists(info_path) else None
    shards = list_shards(output_dir)
    paths = [p for split_paths in shards.values() for p in split_paths]
    names, offset = load_class_names(output_dir), summary.get("label_offset", 0)
    if use_beam:
        check = VerifyShards(fmt, names, offset, decode_all)
        checks = _check_with_beam(paths, check, output_dir, list(beam_args))
    else:
        checks = [check_shard(p, fmt, names, offset, decode_all=decode_all) for p in paths]
    problems = [f"{c.path}: offset {c.offset}: {c.error}" for c in checks if not c.ok]
    problems += check_layout(shards, summary)
    if not problems:
        problems += check_counts(checks, summary, tfds_info)
    return checks, problems


def main(argv: list[str]) -> int:
    parser = CommandParser("verify", __doc__)
    parser.epilog = (
        "Any Apache Beam pipeline option is accepted too (--runner, --project, --region, "
        "--temp_location, ...; `convert --help_all` lists them): with one, the shards are checked "
        "by a Beam pipeline on that runner, as with --beam."
    )
    parser.add_argument("--all", action="store_true", help="Decode every image, not a sample.")
    parser.add_argument("--beam", action="store_true", help="Check the shards with a Beam pipeline.")
    args, beam_args = parser.parse_known_args(argv)
    check_args(beam_args, known=("--all", "--beam"))  # the rest must be known Beam pipeline options
    checks, problems = verify(
        args.output_dir, decode_all=args.all, use_beam=args.beam or bool(beam_args), beam_args=beam_args
    )
    records = sum(c.records for c in checks)
    if problems:
        print(f"img2tfrecord verify: FAILED: {problems[0]}", file=sys.stderr)
        if len(problems) > 1:
            print(f"img2tfrecord verify: ... and {len(problems) - 1} more problem(s)", file=sys.stderr)
        return 1
    decoded = sum(c.decoded for c in checks)
    print(f"img2tfrecord verify: OK: {records} records in {len(checks)} shards, {decoded} images decoded")
    return 0


class CommandParser(argparse.ArgumentParser):
    """The parser of a verb that reads a dataset (OUTPUT_DIR): mistakes are UserErrors (one
    line, exit 2), each flag's default is shown."""

    def __init__(self, verb: str, doc: str):
        super().__init__(
            prog=f"{prog_name()} {verb}", description=doc.splitlines()[0], formatter_class=Formatter
        )
        self.add_argument("output_dir", help="The conversion's --output_dir (local or gs://).")

    def error(self, message: str):
        raise UserError(message)
