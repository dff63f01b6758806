"""Memory of local writes: what the runner and its writer processes hold does not follow a shard's size.

Real conversions on the local runner and real worker processes (forked): a worker gets a
shard in parts of at most PART_RECORDS records, joined into the same bytes; the runner's
records are pickled for the workers without growing a `__dict__` each; writers forked before
the run (`prestart`) are the ones that write, get a class index made after their fork, and
none is left behind by a run. The memory figures themselves are measured by
benchmarks/memory.py, never here.
"""

from __future__ import annotations

import filecmp
import gc
import os
import pickle
from pathlib import Path

import pytest
from apache_beam import coders

from beam_pipeline import main
from beam_pipeline.pipeline import register_coders
from tests.conftest import read_records, write_image
from transforms.encoding.encoder import EncodeSettings
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.writing import processes
from transforms.writing.shard import ShardJob

register_coders()  # as build_pipeline does: the ShardTask coder

PARTS_LOG = "IMG2TFRECORD_TEST_PARTS_LOG"


def _logging_write(task, *args):
    """processes._write_in_worker that first notes, in the worker, how many records it was given."""
    records = (pickle.loads(task) if isinstance(task, bytes) else task).records
    with open(os.environ[PARTS_LOG], "a") as f:
        f.write(f"{len(records)}\n")
    return _REAL_WRITE(task, *args)


_REAL_WRITE = processes._write_in_worker


@pytest.fixture(scope="module")
def one_class(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("memory") / "images"
    for i in range(30):
        write_image(root / "only" / f"{i:02d}.png", (6 + i % 4, 5), seed=i)
    return root


def _convert(root: Path, out: Path, *extra: str) -> dict:
    args = ["--input", str(root), "--output_dir", str(out), "--quiet", "--num_shards", "1", "--write_index"]
    return main.run(args + list(extra), save_main_session=False)


def test_a_worker_gets_a_large_shard_in_parts_of_at_most_part_records(one_class, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    _convert(one_class, whole, "--write_processes", "1")
    log = tmp_path / "parts.log"
    monkeypatch.setenv(PARTS_LOG, str(log))
    monkeypatch.setattr(processes, "PART_RECORDS", 4, raising=False)
    monkeypatch.setattr(processes, "_write_in_worker", _logging_write)
    parts = tmp_path / "parts"
    summary = _convert(one_class, parts, "--write_processes", "2")

    given = [int(n) for n in log.read_text().split()]
    assert sum(given) == 30 and max(given) <= 4  # one shard of 30 records, 8 parts
    assert summary["written"] == 30
    names = sorted(os.listdir(whole))
    assert names == sorted(os.listdir(parts)) and any(n.endswith(".idx") for n in names)
    for name in names:  # the shard and its index: byte for byte the shard written whole
        assert filecmp.cmp(whole / name, parts / name, shallow=False), name


def test_parts_keep_the_order_and_hold_at_most_part_records():
    task = ShardTask("train", 0, tuple(ImageRecord(f"/{i}", f"{i}", 1) for i in range(16)))
    (cut,) = processes.split_shards([task], 3, most=4)  # 3 parts for the last shard, 4 for `most`
    assert [len(p.records) for p in cut] == [4, 4, 4, 4]
    assert [r for p in cut for r in p.records] == list(task.records)
    assert [len(p) for p in processes.split_shards([task], 3, most=9)[0]] == [5, 5, 6]
    assert [len(p) for p in processes.split_shards([task], 1, most=5)[0]] == [4, 4, 4, 4]


def test_the_runners_records_are_sent_without_growing_a_dict_each(tmp_path):
    """Pickle's default reduction of a dataclass asks for its `__dict__`, which CPython 3.11+
    then makes and keeps on the runner's record (~100 bytes each, for as long as the record
    lives). Whether an instance has one shows in what the collector sees it refer to."""
    n = 300
    records = tuple(
        ImageRecord(str(tmp_path / f"missing-{i}.jpg"), f"c/{i}.jpg", 10, ("c",)) for i in range(n)
    )
    assert not any(type(r) is dict for r in gc.get_referents(records[0]))
    workers = processes.ShardProcesses(2)
    try:
        tasks = [ShardTask("train", 0, records[:200]), ShardTask("train", 1, records[200:])]
        outcomes = list(workers.write(tasks, ClassIndex(("c",)), ShardJob(str(tmp_path / "tmp"))))
    finally:
        workers.close()
    assert sorted(len(o.failures) for o in outcomes) == [100, 200]  # every file is missing: sent and read
    with_dict = [r for r in records if any(type(x) is dict for x in gc.get_referents(r))]
    assert not with_dict, f"{len(with_dict)} of {n} records grew a __dict__"


def _records_alive(before: frozenset[int] = frozenset()) -> int:
    """ImageRecords alive now that were not alive in `before` (their ids)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is ImageRecord and id(o) not in before)


def test_the_runner_holds_a_shards_records_as_columns_not_objects(one_class, tmp_path, monkeypatch):
    """A shard of tiny images holds up to ~200,000 records: the runner gets them from the
    GroupByShard as columns and hands them to the writers as columns, with no ImageRecord
    (~500 bytes each) built per image on its side. Counted in a real run, while the tasks
    of a round are handed over."""
    seen: list[tuple[int, int]] = []
    real_write = processes.ShardProcesses.write
    # Records other tests of this process keep (module-level tables) are held here, so their
    # ids stay theirs: only records made during this run count.
    gc.collect()
    earlier = [o for o in gc.get_objects() if type(o) is ImageRecord]
    before = frozenset(map(id, earlier))

    def counting_write(self, tasks, class_index, job):
        alive = _records_alive(before)
        seen.append((sum(len(t.records) for t in tasks), alive))
        return real_write(self, tasks, class_index, job)

    monkeypatch.setattr(processes.ShardProcesses, "write", counting_write)
    summary = _convert(one_class, tmp_path / "out", "--write_processes", "2")
    assert summary["written"] == 30
    assert seen and sum(n for n, _ in seen) == 30
    assert all(alive == 0 for _, alive in seen), f"ImageRecords alive in the runner: {seen}"


def test_a_decoded_shard_task_shares_its_split_and_labels_and_builds_no_record():
    """The GroupByShard's element, decoded by the registered coder: columns whose repeated
    split names and label tuples are one object each (decoded apart they cost ~110 bytes a
    record), equal to the task encoded, and the same again once pickled for a worker."""
    n = 3000
    records = tuple(
        ImageRecord(f"/data/c{i % 7}/{i:05d}.jpg", f"c{i % 7}/{i:05d}.jpg", 633, (f"c{i % 7}",), "train")
        for i in range(n)
    )
    task = ShardTask("train", 4, records)
    coder = coders.registry.get_coder(ShardTask)
    encoded = coder.encode(task)
    alive = _records_alive()
    decoded = coder.decode(encoded)
    assert _records_alive() == alive  # none built
    assert decoded == task and len(decoded) == n and decoded.index == 4
    assert len({id(s) for s in decoded.batch.splits}) == 1
    assert len({id(labels) for labels in decoded.batch.labels}) == 7
    sent = pickle.loads(processes.dump_task(decoded.part(10, 2010)))
    assert sent == ShardTask("train", 4, task.records[10:2010])
    assert len({id(labels) for labels in sent.batch.labels}) == 7
    odd = ShardTask("train", 0, (ImageRecord("/x", "x", 1, (), "val"), ImageRecord("/y\udcff", "y", 2)))
    assert coder.decode(coder.encode(odd)) == odd  # a split of its own; a surrogate path (pickled)


def _children() -> set[int]:
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
                found.add(int(entry))
    return found


def test_prestarted_workers_write_with_a_class_index_made_after_their_fork(tmp_path):
    processes.prestart(2)
    forked = _children()
    try:
        index = ClassIndex(("ant", "bee", "cow"), offset=1)  # made after the workers exist
        paths = [write_image(tmp_path / "in" / f"{i}.png", (5, 4), seed=i) for i in range(6)]
        names = ("cow", "ant", "bee", "cow", "bee", "ant")
        records = tuple(
            ImageRecord(str(p), p.name, p.stat().st_size, (name,))
            for p, name in zip(paths, names, strict=True)
        )
        job = ShardJob(str(tmp_path / "out"), settings=EncodeSettings())
        workers = processes.ShardProcesses(2)
        assert _children() == forked  # it took the prestarted workers: none forked now
        outcomes = list(workers.write([ShardTask("train", 0, records)], index, job))
        workers.close()
    finally:
        processes.stop_prestarted()
    (outcome,) = outcomes
    assert outcome.result.records == 6
    os.rename(outcome.result.temp_path, tmp_path / "out" / "train-00000-of-00001.tfrecord")
    labels = [(list(r["label"]), r["text"][0]) for r in read_records(tmp_path / "out", "train")]
    assert labels == [([index.id_of(n)], n) for n in names]
    assert not [f for f in os.listdir(os.path.dirname(outcome.result.temp_path)) if "classes" in f]


def test_a_run_leaves_no_writer_behind_and_unused_prestarted_ones_stop(one_class, tmp_path):
    before = _children()
    assert _convert(one_class, tmp_path / "out", "--write_processes", "2")["written"] == 30
    assert _children() == before

    processes.prestart(2)
    assert len(_children() - before) == 2
    processes.stop_prestarted()
    assert _children() == before
