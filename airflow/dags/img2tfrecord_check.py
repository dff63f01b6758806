"""check_summary's verdict on a run's output folder (local or gs://): is it this run's dataset?

In: the folder, the run's failure budget and when its conversion was launched. Out: the
counts the next task gets as XCom (output_dir, listed, written, failed), or
AirflowFailException saying why the folder holds no dataset of this run. The rule is the
CLI's own (docs/reliability.md): finished = summary.json present and the in-progress
marker absent; a run that stopped short (too many failed images) next to an older dataset
leaves `aborted-failures.jsonl`, newer than that dataset's summary.json.

What is read: the modification times of four names (one metadata request each on gs://)
and the head of summary.json (its first 64 KiB, where the CLI writes the counts first);
the whole file only if the counts are not in that head. Nothing else is downloaded.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone

from airflow.sdk.exceptions import AirflowFailException

SUMMARY_FILE = "summary.json"
FAILURES_FILE = "failures.jsonl"
MARKER_FILE = ".img2tfrecord-in-progress.json"
ABORTED_FAILURES_FILE = "aborted-failures.jsonl"
COUNTS = ("listed", "written", "failed")
HEAD_BYTES = 64 * 1024
_SPACE = re.compile(r"\s*")


class Folder:
    """A local folder or a gs:// prefix: modification times and reads of the names in it."""

    def __init__(self, path: str, gcp_conn_id: str = "google_cloud_default"):
        self.path = path.rstrip("/")
        self._bucket = None
        if self.path.startswith("gs://"):
            from airflow.providers.google.cloud.hooks.gcs import GCSHook

            bucket, _, self._prefix = self.path[len("gs://") :].partition("/")
            self._bucket = GCSHook(gcp_conn_id=gcp_conn_id).get_conn().bucket(bucket)

    def modified(self, name: str) -> float | None:
        """When `name` was last written (seconds since the epoch), None if it is missing."""
        if self._bucket is None:
            try:
                return os.stat(os.path.join(self.path, name)).st_mtime
            except FileNotFoundError:
                return None
        blob = self._bucket.get_blob(f"{self._prefix}/{name}" if self._prefix else name)
        return None if blob is None else blob.updated.timestamp()

    def read(self, name: str, size: int | None = None) -> bytes:
        """The first `size` bytes of `name` (all of it if None)."""
        if self._bucket is None:
            with open(os.path.join(self.path, name), "rb") as f:
                return f.read(-1 if size is None else size)
        blob = self._bucket.blob(f"{self._prefix}/{name}" if self._prefix else name)
        return blob.download_as_bytes(end=None if size is None else size - 1)


def top_level_values(text: str, wanted: tuple[str, ...], complete: bool = True) -> dict | None:
    """The `wanted` keys of the JSON object that `text` starts with, read key by key up to
    the last one needed. `complete` False: `text` is a head of the document, and None means
    it ends before all of them were read.

    Raises:
      ValueError: not a JSON object, or one without a wanted key.
    """
    decoder, found = json.JSONDecoder(), {}
    i = _SPACE.match(text).end()
    if not text.startswith("{", i):
        raise ValueError("not a JSON object")
    i += 1
    try:
        while len(found) < len(wanted):
            i = _SPACE.match(text, i).end()
            if text.startswith("}", i):
                raise ValueError(f"{', '.join(k for k in wanted if k not in found)} missing")
            key, i = decoder.raw_decode(text, i)
            i = _SPACE.match(text, i).end()
            if not text.startswith(":", i):
                raise ValueError("not a JSON object")
            value, i = decoder.raw_decode(text, _SPACE.match(text, i + 1).end())
            if key in wanted:
                found[key] = value
            i = _SPACE.match(text, i).end()
            if text.startswith(",", i):
                i += 1
    except json.JSONDecodeError as e:
        if complete:
            raise ValueError(f"not valid JSON ({e})") from None
        return None
    return found


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_output(
    output_dir: str,
    max_failure_ratio: float,
    started: float | None,
    gcp_conn_id: str = "google_cloud_default",
) -> dict:
    """The verdict on `output_dir` after a conversion launched at `started` (seconds since
    the epoch; None: not known, the age is not checked). See the module docstring.

    Raises:
      AirflowFailException: the folder holds no finished dataset of this run, or one whose
        counts do not add up or exceed the failure budget.
    """
    folder = Folder(output_dir, gcp_conn_id)

    def fail(why: str):
        raise AirflowFailException(f"{output_dir}: {why}")

    if folder.modified(MARKER_FILE) is not None:
        fail(
            f"no finished dataset: {MARKER_FILE} is there (a run is writing the folder, or "
            "stopped short of publishing: see its log). A finished dataset has summary.json "
            "and no marker."
        )
    summary_time = folder.modified(SUMMARY_FILE)
    if summary_time is None:
        listed_failures = folder.modified(FAILURES_FILE) is not None
        fail(
            "no summary.json: no dataset was published"
            + (f" ({FAILURES_FILE} lists the images that failed)" if listed_failures else "")
        )
    aborted_time = folder.modified(ABORTED_FAILURES_FILE)
    if aborted_time is not None and aborted_time >= summary_time:
        fail(
            f"a later run stopped short ({ABORTED_FAILURES_FILE}, {_when(aborted_time)}: too many "
            f"images failed); summary.json ({_when(summary_time)}) is an older dataset's"
        )
    if started is not None and summary_time < started:
        fail(
            f"summary.json ({_when(summary_time)}) is older than this run ({_when(started)}): "
            "an earlier dataset, not this run's"
        )
    head = folder.read(SUMMARY_FILE, HEAD_BYTES)
    try:
        counts = top_level_values(head.decode("utf-8", "ignore"), COUNTS, len(head) < HEAD_BYTES)
        if counts is None:
            counts = top_level_values(folder.read(SUMMARY_FILE).decode("utf-8"), COUNTS)
    except ValueError as e:
        fail(f"summary.json cannot be read: {e}")
    listed, written, failed = (counts[k] for k in COUNTS)
    if listed != written + failed:
        fail(f"summary.json: listed {listed} != written {written} + failed {failed}")
    if not written:
        fail("no image was written")
    if failed > max_failure_ratio * listed:
        fail(f"{failed} of {listed} images failed, more than max_failure_ratio {max_failure_ratio}")
    return {"output_dir": output_dir, **counts}
