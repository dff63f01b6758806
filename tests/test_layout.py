"""Split assignment, shuffle and shard planning (pure functions and the Beam composites)."""

import collections

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.layout import PlanShards, parse_split_ratios, plan_shards, record_size, split_for_key
from transforms.records import ImageRecord, RecordBatch


def _records(n, size=1000, classes=("a", "b", "c")):
    return [
        ImageRecord(
            path=f"/in/{classes[i % len(classes)]}/{i}.jpg",
            relpath=f"{classes[i % len(classes)]}/{i}.jpg",
            size=size + (i * 37) % 500,
            labels=(classes[i % len(classes)],),
        )
        for i in range(n)
    ]


def test_parse_split_ratios():
    assert parse_split_ratios("train=0.8,validation=0.1,test=0.1") == (
        ("train", 0.8),
        ("validation", 0.1),
        ("test", 0.1),
    )
    for bad in ("train=0.5", "train", "train=x", "a=0.5,a=0.5", "a=-1,b=2"):
        with pytest.raises(ValueError):
            parse_split_ratios(bad)


def test_split_assignment_is_stable_and_near_ratios():
    ratios = parse_split_ratios("train=0.8,validation=0.1,test=0.1")
    keys = [f"cls/{i}.jpg" for i in range(5000)]
    first = {k: split_for_key(k, 7, ratios) for k in keys}
    # Adding images never moves existing ones.
    more = {k: split_for_key(k, 7, ratios) for k in keys + [f"new/{i}.jpg" for i in range(500)]}
    assert all(more[k] == first[k] for k in keys)
    counts = collections.Counter(first.values())
    assert abs(counts["train"] / 5000 - 0.8) < 0.03
    assert abs(counts["test"] / 5000 - 0.1) < 0.02
    # The seed matters.
    assert sum(split_for_key(k, 8, ratios) != first[k] for k in keys) > 500


def test_plan_by_size_fills_every_shard_but_last_near_target():
    records = _records(400)
    target = 20 * 1300
    shards = plan_shards(records, seed=1, target_bytes=target)
    assert sorted(r.relpath for s in shards for r in s) == sorted(r.relpath for r in records)
    for shard in shards[:-1]:
        assert abs(sum(record_size(r) for r in shard) - target) <= 0.1 * target
    assert sum(record_size(r) for r in shards[-1]) <= 1.1 * target


def test_plan_by_count_and_determinism_and_mixing():
    records = _records(300)
    a = plan_shards(records, seed=3, num_shards=4)
    b = plan_shards(list(reversed(records)), seed=3, num_shards=4)
    assert [[r.relpath for r in s] for s in a] == [[r.relpath for r in s] for s in b]
    assert len(a) == 4
    for shard in a:
        assert len({r.labels for r in shard}) == 3  # classes mixed in every shard
        assert 50 <= len(shard) <= 100
    c = plan_shards(records, seed=4, num_shards=4)
    assert [r.relpath for r in a[0]] != [r.relpath for r in c[0]]


def test_plan_shards_transform():
    records = _records(50) + [
        ImageRecord(path=f"/in/v/{i}.jpg", relpath=f"v/{i}.jpg", size=10, split="validation")
        for i in range(5)
    ]
    with TestPipeline() as p:
        batches = [RecordBatch(tuple(records[i : i + 7])) for i in range(0, len(records), 7)]  # splits mixed
        tasks = p | beam.Create(batches) | PlanShards(seed=1, target_bytes=10_000, num_shards=None)
        summary = tasks | beam.Map(lambda t: (t.split, t.index, len(t.records)))
        expected = [("train", i, len(s)) for i, s in enumerate(plan_shards(records[:50], 1, 10_000))]
        expected.append(("validation", 0, 5))
        assert_that(summary, equal_to(expected))
