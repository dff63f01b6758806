"""failures.jsonl from sorted parts: counts by combiner, one group per part, a streamed merge."""

import json

from apache_beam.metrics.metric import MetricsFilter

from beam_pipeline import main
from tests.conftest import write_image
from transforms.batching import GROUP_SIZE_NAMESPACE
from transforms.failures import Failure
from transforms.output import failure_log
from transforms.output.beam import FailureCountsFn
from transforms.output.failure_log import merge_parts, write_part


def _failures(n):
    return [
        Failure(
            f"/in/c{i % 3}/{(i * 7919) % n:05d}.jpg",
            f"reason {i}",
            ("read", "decode")[i % 2],
            "train",
            f"c{i % 3}",
        )
        for i in range(n)
    ]


def test_parts_merge_into_one_sorted_file(tmp_path):
    failures = _failures(50) + [Failure("/in/x\udcff.jpg", "bad name", "list")]  # undecodable bytes
    parts = [write_part(str(tmp_path), p, failures[p::4]) for p in range(4)]
    merge_parts(parts, str(tmp_path / "failures.jsonl"))
    lines = (tmp_path / "failures.jsonl").read_text("utf-8").splitlines()
    assert lines == [f.to_json() for f in sorted(failures, key=lambda f: (f.path, f.stage))]
    merge_parts([], str(tmp_path / "none.jsonl"))
    assert (tmp_path / "none.jsonl").read_bytes() == b""
    fn = FailureCountsFn()
    halves = [fn.create_accumulator(), fn.create_accumulator()]
    for i, f in enumerate(failures):
        fn.add_input(halves[i % 2], f)
    counts = fn.extract_output(fn.merge_accumulators(halves))
    assert counts.failed == 51 and dict(counts.by_stage) == {"decode": 25, "list": 1, "read": 25}
    assert sum(n for _, n in counts.by_class) == 50


def test_many_failures_are_written_in_parts_and_merged_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(failure_log, "PART_SIZE", 4)  # 23 failures: 6 parts (the runner runs in this process)
    root = tmp_path / "in"
    for i in range(23):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.jpg").write_bytes(b"not an image %d" % i)
    for i in range(3):
        write_image(root / "c0" / f"ok{i}.png", seed=i)
    results = []
    out = tmp_path / "out"
    args = ["--input", str(root), "--output_dir", str(out), "--quiet", "--max_failure_ratio", "1"]
    summary = main.run(args, save_main_session=False, on_result=results.append)
    assert summary["listed"] == 26 and summary["written"] == 3 and summary["failed"] == 23
    assert summary["splits"]["train"]["classes"]["c1"]["failed"] == 11
    lines = (out / "failures.jsonl").read_text("utf-8").splitlines()
    paths = [json.loads(line)["path"] for line in lines]
    assert len(paths) == 23 and paths == sorted(paths)
    sizes = [
        d.committed
        for d in results[0].metrics().query(MetricsFilter())["distributions"]
        if d.key.metric.namespace == GROUP_SIZE_NAMESPACE
        and d.key.metric.name == "WriteMetadata/GroupFailures"
    ]
    # ceil(23 / 4) = 6 hash buckets (one may be empty), each group a part, 23 failures in all.
    assert sizes and 2 <= sum(s.count for s in sizes) <= 6 and sum(s.sum for s in sizes) == 23
