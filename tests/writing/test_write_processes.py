"""Shards written in worker processes (--write_processes): same bytes, same summary, live progress.

Real pipelines on the local runner: the same dataset written by the runner's own process
and by two worker processes must give identical files; a worker's progress reaches the
run's Progress while its shard is still being written; a bug in a worker fails the job.
"""

from __future__ import annotations

import collections
import filecmp
import json
import os
import signal
import threading
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordSink  # Beam's own writer, for a byte-for-byte check
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline

from beam_pipeline import main
from beam_pipeline.cli import local_runner
from beam_pipeline.cli.options import ConvertOptions
from tests.conftest import frame_record, read_records, write_image
from transforms import progress
from transforms.encoding.encoder import EncodeSettings
from transforms.images.read import read_bytes
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.writing import beam as write
from transforms.writing.beam import WriteShards
from transforms.writing.processes import ShardProcesses, split_shards
from transforms.writing.shard import COMPRESSIONS, ShardFile, ShardJob, shard_suffix


def make_sink(output_dir: str, split: str, compression: str) -> _TFRecordSink:
    """Beam's TFRecord sink for one split, as WriteToTFRecord makes it."""
    return _TFRecordSink(
        file_path_prefix=FileSystems.join(output_dir, split),
        coder=coders.BytesCoder(),
        file_name_suffix=shard_suffix(compression),
        num_shards=0,
        shard_name_template="-SSSSS-of-NNNNN",
        compression_type=COMPRESSIONS[compression],
    )


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_shard_file_writes_the_bytes_of_beams_tfrecord_sink(tmp_path, compression):
    records = [b"", b"x", os.urandom(70_000), b"\x00" * 5000, os.urandom(300)] * 3
    writer = make_sink(str(tmp_path), "train", compression).open_writer(str(tmp_path / "beam"), "s")
    for r in records:
        writer.write(r)
    beam_path = writer.close()
    with ShardFile(str(tmp_path / "ours" / "s.train.tfrecord"), compression) as shard:
        for r in records:
            shard.write(r)
    assert Path(shard.path).read_bytes() == Path(beam_path).read_bytes()


def test_shard_file_writes_chunked_records_whole_after_short_writes(tmp_path, monkeypatch):
    """Records given as chunks and written with writev calls that each write only part of
    what they are given (as a signal or a full pipe may) come out whole and in order."""
    records = [[b"ab", os.urandom(70_000), b""], [b""], [os.urandom(5000)], [b"x", b"y" * 3000, b"z"]] * 40
    real_writev = os.writev
    calls = []

    def short_writev(fd: int, buffers) -> int:
        calls.append(len(buffers))
        budget, given = 777 + 13 * len(calls), []
        for buffer in buffers:
            if budget <= 0:
                break
            given.append(memoryview(buffer)[:budget])
            budget -= len(buffer)
        return real_writev(fd, given)

    monkeypatch.setattr(os, "writev", short_writev)
    with ShardFile(str(tmp_path / "s.tfrecord")) as shard:
        for chunks in records:
            shard.write_chunks(chunks, sum(map(len, chunks)))
    assert len(calls) > len(records)  # the writes were short
    expected = b"".join(frame_record(b"".join(chunks)) for chunks in records)
    assert Path(shard.path).read_bytes() == expected


def test_largest_shards_go_first_and_the_last_ones_in_parts():
    def task(index: int, n: int) -> ShardTask:
        return ShardTask("train", index, tuple(ImageRecord(f"/{index}/{i}", f"{i}", 10) for i in range(n)))

    tasks = [task(0, 30), task(1, 30), task(2, 5), task(3, 30), task(4, 31)]
    plan = split_shards(tasks, 2)
    assert [[(p.index, len(p.records)) for p in parts] for parts in plan] == [
        [(4, 31)],
        [(0, 30)],
        [(1, 30)],
        [(3, 15), (3, 15)],
        [(2, 2), (2, 3)],
    ]
    assert [part.records for part in plan[3]] == [tasks[3].records[:15], tasks[3].records[15:]]
    assert split_shards(tasks, 1) == [[t] for t in sorted(tasks, key=lambda t: -len(t.records))]


@pytest.fixture(scope="module")
def mixed_tree(tmp_path_factory) -> Path:
    """Three classes of small JPEGs and PNGs, and one file that does not decode."""
    root = tmp_path_factory.mktemp("procs") / "images"
    for i in range(60):
        fmt = "png" if i % 7 == 0 else "jpg"
        write_image(root / ("ant", "bee", "cow")[i % 3] / f"{i:03d}.{fmt}", (20 + i % 13, 18 + i % 5), seed=i)
    (root / "bee" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


def _convert(root: Path, out: Path, *extra: str) -> dict:
    args = ["--input", str(root), "--output_dir", str(out), "--quiet", "--max_failure_ratio", "0.1"]
    return main.run(
        args + ["--splits", "train=0.7,validation=0.3", "--shard_size_mb", "0.02", "--seed", "3", *extra],
        save_main_session=False,
    )


def test_worker_processes_write_the_same_dataset_as_the_runner_process(mixed_tree, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _convert(mixed_tree, one, "--write_processes", "1", "--write_index")
    summary = _convert(mixed_tree, two, "--write_processes", "2", "--write_index")
    names = sorted(os.listdir(one))
    assert names == sorted(os.listdir(two))
    assert len([n for n in names if n.startswith("train-") and n.endswith(".tfrecord")]) >= 3
    for name in names:  # shards, index files, summary.json, failures.jsonl and the rest
        assert filecmp.cmp(one / name, two / name, shallow=False), name

    assert (summary["listed"], summary["written"], summary["failed"]) == (61, 60, 1)
    failure = json.loads((two / "failures.jsonl").read_text())
    assert (os.path.basename(failure["path"]), failure["stage"], failure["class_key"]) == (
        "broken.jpg",
        "decode",
        "bee",
    )
    # The per-class written counts carried by the shard results are what the shards hold.
    for split in ("train", "validation"):
        held = collections.Counter(r["text"][0] for r in read_records(two, split))
        counted = {c: v["written"] for c, v in summary["splits"][split]["classes"].items() if v["written"]}
        assert held == counted, split


class GatedReader:
    """Reads real files, but every image except `free_path` waits until the `gate` file exists."""

    def __init__(self, free_path: str, gate: Path):
        self.free_path, self.gate = free_path, str(gate)

    def __call__(self, path: str) -> bytes:
        deadline = time.monotonic() + 30
        while path != self.free_path and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return read_bytes(path)


def _buggy_reader(path: str) -> bytes:
    raise ZeroDivisionError(f"a bug while reading {os.path.basename(path)}")


def _dying_reader(path: str) -> bytes:
    os.kill(os.getpid(), signal.SIGKILL)  # e.g. the kernel's OOM killer
    raise AssertionError("unreachable")


def test_worker_processes_write_in_rounds_the_same_dataset(mixed_tree, tmp_path, monkeypatch):
    """Held shards are written in rounds of HELD_RECORDS records (memory does not follow the dataset)."""
    monkeypatch.setattr(write, "HELD_RECORDS", 5)  # rounds of 3+ shards (the runner runs in this process)
    one, rounds = tmp_path / "one", tmp_path / "rounds"
    _convert(mixed_tree, one, "--write_processes", "1")
    summary = _convert(mixed_tree, rounds, "--write_processes", "2")
    assert summary["written"] == 60 and sorted(os.listdir(one)) == sorted(os.listdir(rounds))
    for name in os.listdir(one):
        assert filecmp.cmp(one / name, rounds / name, shallow=False), name


def _write_one_shard(
    records: tuple[ImageRecord, ...], out: Path, reader, key: str | None = None, processes: int = 2
) -> dict[str, int]:
    """Writes one ShardTask with WriteShards; returns the Beam counters of the run."""
    p = TestPipeline(runner="FnApiRunner")
    index = p | "Index" >> beam.Create([ClassIndex(("c",))])
    tasks = p | "Tasks" >> beam.Create([ShardTask("train", 0, records)])
    _ = tasks | "Write" >> WriteShards(
        str(out),
        str(out / "tmp"),
        index,
        "none",
        EncodeSettings(),
        reader=reader,
        progress_key=key,
        processes=processes,
    )
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter())["counters"]
    return {
        c.key.metric.name: c.committed
        for c in counters
        if c.key.metric.name.startswith(("images_", "bytes_"))
    }


def _records(root: Path, n: int) -> tuple[ImageRecord, ...]:
    paths = [write_image(root / "c" / f"{i}.png", seed=i) for i in range(n)]
    return tuple(ImageRecord(str(p), f"c/{p.name}", p.stat().st_size, ("c",)) for p in paths)


def test_progress_moves_while_a_worker_writes_its_shard(tmp_path):
    records = _records(tmp_path / "in", 4)
    gate = tmp_path / "gate"
    key = "test-write-processes-progress"
    tally = progress.register(key)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _write_one_shard(records, tmp_path / "out", GatedReader(records[0].path, gate), key)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    writing = threading.Thread(target=run)
    writing.start()
    try:
        deadline = time.monotonic() + 20
        while tally.snapshot()[1] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        # The other images wait for the gate: the first one is already counted.
        time.sleep(0.3)
        assert tally.snapshot()[1] == 1 and tally.snapshot()[3] > 0
    finally:
        gate.touch()
        writing.join(60)
        progress.unregister(key)
    assert not errors, errors
    assert tally.snapshot()[1] == 4


@pytest.mark.parametrize("processes", [1, 2])
def test_beam_counters_count_every_image_whoever_writes_it(tmp_path, processes):
    records = _records(tmp_path / "in", 5)
    broken = tmp_path / "in" / "c" / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n broken")
    records += (ImageRecord(str(broken), "c/broken.png", broken.stat().st_size, ("c",)),)
    counters = _write_one_shard(records, tmp_path / "out", read_bytes, processes=processes)
    (shard,) = (tmp_path / "out" / "tmp" / "train").glob("*.tfrecord")
    data_bytes = shard.stat().st_size - 16 * 5  # framing: 16 bytes a record
    assert counters == {"images_encoded": 5, "images_failed": 1, "bytes_written": data_bytes}


@pytest.mark.parametrize(
    "reader,message",
    [(_buggy_reader, r"a bug while reading [01]\.png"), (_dying_reader, "terminated abruptly")],
)
def test_a_bug_or_a_death_in_a_worker_process_fails_the_job(tmp_path, reader, message):
    records = _records(tmp_path / "in", 2)
    with pytest.raises(Exception, match=message):
        _write_one_shard(records, tmp_path / "out", reader)


def test_write_processes_default_to_one_per_core_where_the_runner_runs_the_dofns():
    def resolved(*argv: str) -> int:
        options = PipelineOptions(list(argv))
        local_runner.local_defaults(options, list(argv))
        return options.view_as(ConvertOptions).write_processes

    cores = len(os.sched_getaffinity(0))
    assert resolved() == cores
    assert resolved("--direct_num_workers=2") == cores  # multi_threading: one runner process
    assert resolved("--direct_running_mode=multi_processing", "--direct_num_workers=2") == 1
    assert resolved("--write_processes=3") == 3
    remote = PipelineOptions(["--runner=DataflowRunner"])
    local_runner.local_defaults(remote, ["--runner=DataflowRunner"])
    assert remote.view_as(ConvertOptions).write_processes == 0  # the pipeline writes in-process


def test_worker_processes_read_and_write_gs_paths(gcs_bucket, image_tree, tmp_path):
    from tests.gcs_emulator import BUCKET, download_prefix, upload_tree

    upload_tree(gcs_bucket, image_tree, "in")
    args = ["--input", f"gs://{BUCKET}/in/", "--quiet", "--compression", "gzip", "--num_shards", "2"]
    summary = main.run(
        args + ["--output_dir", f"gs://{BUCKET}/out", "--write_processes", "2"], save_main_session=False
    )
    local_args = ["--input", str(image_tree), "--quiet", "--compression", "gzip", "--num_shards", "2"]
    local = main.run(local_args + ["--output_dir", str(tmp_path / "local")], save_main_session=False)
    names = download_prefix(gcs_bucket, "out", tmp_path / "out")
    assert summary["written"] == local["written"] == 6
    for name in names:
        if name.endswith(".tfrecord.gz"):
            assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


def test_workers_count_in_their_own_slots_and_the_progress_adds_up(tmp_path):
    """Each worker adds to its own slot (no lock); the run's Progress gets the exact sum."""
    records = _records(tmp_path / "in", 12)
    tasks = [ShardTask("train", i, records[3 * i : 3 * i + 3]) for i in range(4)]
    tally = progress.Progress()
    pool = ShardProcesses(2, progress=tally)
    try:
        outcomes = list(pool.write(tasks, ClassIndex(("c",)), ShardJob(str(tmp_path / "tmp"))))
    finally:
        pool.close()
    assert pool._counts.taken.value == 2  # one slot each, taken as each worker started
    written = [o.result for o in outcomes if o.result is not None]
    assert sum(r.records for r in written) == 12
    _, images, failed, nbytes, _ = tally.snapshot()
    assert (images, failed) == (12, 0)
    assert (
        nbytes
        == sum(r.bytes for r in written)
        == sum(p.stat().st_size - 16 * 3 for p in _temp_shards(tmp_path))
    )


def _temp_shards(root: Path) -> list[Path]:
    return sorted((root / "tmp" / "train").glob("*.tfrecord"))
