"""Reading images: transient errors retried with backoff, permanent ones named, nothing hangs."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from google.api_core import exceptions as gexc

from tests.conftest import read_records, write_image
from transforms.encoding.encoder import EncodeSettings
from transforms.images.read import ReadError, read_bytes, read_with_retries
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.retry import RetryPolicy, is_transient
from transforms.writing.beam import WriteShards
from transforms.writing.shard import ShardJob, write_shard

FAST = RetryPolicy(attempts=4, initial_delay=0.001, max_delay=0.002)


class FlakyReader:
    """Reads real files, but each path fails `failures` times first with a transient error.

    The attempt count lives in files next to the images, so it survives the pickling
    Beam does to ship the reader to its workers.
    """

    def __init__(self, count_dir: Path, failures: int, error: Exception):
        self.count_dir, self.failures, self.error = str(count_dir), failures, error

    def attempts(self, path: str) -> int:
        counter = os.path.join(self.count_dir, os.path.basename(path) + ".attempts")
        return os.path.getsize(counter) if os.path.exists(counter) else 0

    def __call__(self, path: str) -> bytes:
        counter = os.path.join(self.count_dir, os.path.basename(path) + ".attempts")
        with open(counter, "ab") as f:
            f.write(b".")
        if self.attempts(path) <= self.failures:
            raise self.error
        return read_bytes(path)


def test_transient_errors_are_retried_with_growing_delays(tmp_path):
    path = write_image(tmp_path / "a.png")
    reader = FlakyReader(tmp_path, 2, OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    slept: list[float] = []
    policy = RetryPolicy(attempts=4, initial_delay=0.5, max_delay=10, jitter=0)
    assert read_with_retries(str(path), reader, policy, sleep=slept.append) == path.read_bytes()
    assert reader.attempts(str(path)) == 3 and slept == [0.5, 1.0]


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        OSError(errno.EIO, "Input/output error"),
        gexc.ServiceUnavailable("503 backend error"),
        gexc.InternalServerError("500"),
        gexc.TooManyRequests("429 slow down"),
    ],
)
def test_still_failing_after_all_attempts_is_a_read_error(tmp_path, error):
    path = write_image(tmp_path / "a.png")
    reader = FlakyReader(tmp_path, 99, error)
    with pytest.raises(ReadError, match="still failing after 4 attempts"):
        read_with_retries(str(path), reader, FAST)
    assert reader.attempts(str(path)) == 4


@pytest.mark.parametrize(
    "error", [gexc.NotFound("404 gone"), gexc.Forbidden("403"), OSError(errno.EACCES, "Permission denied")]
)
def test_permanent_errors_fail_at_once(tmp_path, error):
    path = write_image(tmp_path / "a.png")
    reader = FlakyReader(tmp_path, 99, error)
    assert not is_transient(error)
    with pytest.raises(ReadError):
        read_with_retries(str(path), reader, FAST)
    assert reader.attempts(str(path)) == 1


def test_a_bug_in_the_reader_is_not_swallowed(tmp_path):
    def buggy(path: str) -> bytes:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        read_with_retries(str(tmp_path / "x"), buggy, FAST)


def test_local_files_that_are_not_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.jpg")
    os.symlink(tmp_path / "gone.jpg", tmp_path / "broken.jpg")
    os.symlink("loop.jpg", tmp_path / "loop.jpg")
    (tmp_path / "dir.jpg").mkdir()
    reasons = {}

    def read_all():
        for name in ("fifo.jpg", "broken.jpg", "loop.jpg", "dir.jpg", "removed.jpg"):
            try:
                read_with_retries(str(tmp_path / name), policy=FAST)
            except ReadError as e:
                reasons[name] = str(e)

    reading = threading.Thread(target=read_all, daemon=True)
    reading.start()
    reading.join(timeout=10)
    assert not reading.is_alive(), "reading a FIFO blocked"
    assert reasons == {
        "fifo.jpg": "not a regular file (fifo)",
        "broken.jpg": f"broken symbolic link to {str(tmp_path / 'gone.jpg')!r}",
        "loop.jpg": "symbolic link loop",
        "dir.jpg": "not a regular file (directory)",
        "removed.jpg": "file disappeared after listing (no such file)",
    }


def test_write_shards_retries_a_flaky_reader_in_a_pipeline(tmp_path):
    """A real Beam pipeline: images whose reads fail twice are written; always-failing ones are failures."""
    paths = [write_image(tmp_path / "in" / "c" / f"{i}.png", seed=i) for i in range(4)]
    records = tuple(
        ImageRecord(path=str(p), relpath=f"c/{p.name}", size=p.stat().st_size, labels=("c",)) for p in paths
    )
    out, counts = tmp_path / "out", tmp_path / "counts"
    out.mkdir()
    counts.mkdir()
    flaky = FlakyReader(counts, 2, gexc.ServiceUnavailable("503"))
    hopeless = FlakyReader(counts, 99, ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    with TestPipeline(runner="FnApiRunner") as p:
        index = p | "Index" >> beam.Create([ClassIndex(("c",))])
        for name, reader, task_records in (
            ("Flaky", flaky, records[:3]),
            ("Hopeless", hopeless, records[3:]),
        ):
            tasks = p | f"Tasks{name}" >> beam.Create([ShardTask("train", 0, task_records)])
            shards = tasks | f"Write{name}" >> WriteShards(
                str(out), str(out / "tmp" / name), index, "none", EncodeSettings(), reader=reader, retry=FAST
            )
            reasons = shards.failed | f"Reasons{name}" >> beam.Map(
                lambda f: (os.path.basename(f.path), f.reason)
            )
            expected = (
                []
                if name == "Flaky"
                else [("3.png", "unreadable: Connection reset by peer (still failing after 4 attempts)")]
            )
            assert_that(reasons, equal_to(expected), label=f"Check{name}")
            shard_paths = shards.shards | f"Paths{name}" >> beam.Map(lambda s: s.temp_path)
            _ = shard_paths | f"Publish{name}" >> beam.Map(
                lambda path, name=name: os.rename(path, out / f"{name.lower()}-00000-of-00001.tfrecord")
            )
    assert [flaky.attempts(str(p)) for p in paths[:3]] == [3, 3, 3]
    assert hopeless.attempts(str(paths[3])) == 4
    written = read_records(out, "flaky")
    assert sorted(r["filename"] for r in written) == ["c/0.png", "c/1.png", "c/2.png"]
    assert all(r["encoded"] == (tmp_path / "in" / r["filename"]).read_bytes() for r in written)


def test_files_opened_ahead_give_the_same_shard_and_failures(tmp_path):
    """write_shard with hint_ahead (each file opened a few images early, read through that
    descriptor) writes the same bytes and the same failures as without, never waits on a
    FIFO, and leaves no descriptor open."""
    good = [write_image(tmp_path / "in" / f"{i}.jpg", seed=i) for i in range(12)]
    os.mkfifo(tmp_path / "in" / "fifo.jpg")
    (tmp_path / "in" / "dir.jpg").mkdir()
    os.symlink(tmp_path / "gone.jpg", tmp_path / "in" / "broken.jpg")
    (tmp_path / "in" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    names = [p.name for p in good[:5]] + ["fifo.jpg", "dir.jpg", "broken.jpg", "removed.jpg", "bad.jpg"]
    names += [p.name for p in good[5:]]
    records = tuple(ImageRecord(str(tmp_path / "in" / n), n, 1, ("c",)) for n in names)
    task = ShardTask("train", 0, records)

    def write(hint_ahead: int) -> tuple[bytes, list[tuple[str, str, str]]]:
        job = ShardJob(str(tmp_path / f"tmp{hint_ahead}"))
        outcome = write_shard(task, ClassIndex(("c",)), job, hint_ahead=hint_ahead)
        failures = [(Path(f.path).name, f.stage, f.reason) for f in outcome.failures]
        return Path(outcome.result.temp_path).read_bytes(), failures

    open_before = len(os.listdir("/proc/self/fd"))
    ahead = write(4)
    assert len(os.listdir("/proc/self/fd")) == open_before
    assert ahead == write(0)
    assert [name for name, _, _ in ahead[1]] == [
        "fifo.jpg",
        "dir.jpg",
        "broken.jpg",
        "removed.jpg",
        "bad.jpg",
    ]
    assert ahead[1][0][2] == "unreadable: not a regular file (fifo)"
