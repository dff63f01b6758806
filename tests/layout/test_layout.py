"""Split assignment, shuffle and shard planning (pure functions and the Beam composites)."""

import collections

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.layout.reference import plan_shards, record_size, split_for_key, stratified_splits
from transforms.layout.beam import AssignSplits, PlanShards
from transforms.layout.plan import parse_split_ratios
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


def test_shards_of_a_thousand_records_are_within_two_percent_of_the_target():
    """A shard is a range of the split's weight, not of the hash alone: an equal hash range
    holds a random sum of records, ~3% (sd) off at 1,000 records (issue 25 item 4)."""
    import numpy as np

    from transforms.layout import plan

    n, sizes = 40_000, np.random.default_rng(3).integers(40_000, 200_000, 40_000).tolist()
    batch = plan.with_hashes(
        RecordBatch(tuple(ImageRecord(f"/in/c/{i}.jpg", f"c/{i}.jpg", sizes[i], ("c",)) for i in range(n))), 7
    )
    totals, weights = dict(plan.split_weights(batch, 0)), plan.record_sizes(batch)
    target = 1000 * int(weights.mean())
    scale = plan.shard_scale(totals["train", plan.RECORDS], totals["train", plan.WEIGHTS], target, None)
    shards = plan.shard_indexes(plan.hash_columns(batch.hashes)[1], *scale)
    per_shard = np.bincount(shards, weights=weights)
    assert len(per_shard) == 40 and np.all(np.abs(per_shard[:-1] / target - 1) <= 0.02), per_shard / target


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


def _skewed(n, classes=5):
    """Records of very different sizes (a few far above the shard target), classes of unequal size."""
    sizes = [100, 900, 5_000, 300_000]  # the last is bigger than the 200 KB target below
    return [
        ImageRecord(
            path=f"/in/k{min(i % 11, classes - 1)}/{i}.jpg",
            relpath=f"k{min(i % 11, classes - 1)}/{i}.jpg",
            size=sizes[0 if i % 97 else 3] + sizes[1] * (i % 3) + (i * 7919) % sizes[2],
            labels=(f"k{min(i % 11, classes - 1)}",),
            split="validation" if i % 10 == 0 else "train",
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "target, num, most", [(200_000, None, None), (None, 7, None), (None, 5000, None), (2_000_000, None, 90)]
)
def test_plan_shards_transform_equals_sorting_each_split_whole(target, num, most):
    """Cuts inside hash buckets (resolved in a group) and between them give the reference plan."""
    records = _skewed(3000)
    expected = [
        (split, tuple(r.relpath for r in shard))
        for split in ("train", "validation")
        for shard in plan_shards([r for r in records if r.split == split], 11, target, num, most)
    ]
    if num == 7:  # exact when a shard is much bigger than any record
        assert len([e for e in expected if e[0] == "train"]) == 7
    if most:  # small records reach the cap before the size: a shard within a record or two of it
        assert most - 2 <= max(len(rels) for _, rels in expected) <= most + 2
    with TestPipeline() as p:
        batches = [RecordBatch(tuple(records[i : i + 250])) for i in range(0, len(records), 250)]
        tasks = p | beam.Create(batches) | PlanShards(11, target, num, most)
        # Shard indexes may skip a number (a record bigger than the target): compare in order.
        shape = tasks | beam.Map(lambda t: (t.split, t.index, tuple(r.relpath for r in t.records)))
        ordered = (
            shape
            | beam.combiners.ToList()
            | beam.Map(lambda ts: [(s, rels) for s, _, rels in sorted(ts, key=lambda t: (t[0], t[1]))])
        )
        assert_that(ordered, equal_to([expected]))


def test_a_shard_of_tiny_images_holds_at_most_max_records():
    """The cap bounds a shard by records where the size would not: 1,000 records of ~300 bytes."""
    records = [ImageRecord(f"/in/c/{i}.png", f"c/{i}.png", 40 + i % 7, ("c",)) for i in range(1000)]
    assert [len(s) for s in plan_shards(records, 5, 128 << 20)] == [1000]
    capped = plan_shards(records, 5, 128 << 20, None, 300)
    assert [len(s) for s in capped] == [300, 300, 300, 100]
    assert [r for s in capped for r in s] == plan_shards(records, 5, 128 << 20)[0]  # the same order
    # --num_shards is exact: no cap.
    assert [len(s) for s in plan_shards(records, 5, None, 2, 300)] == [500, 500]


def test_stratified_cuts_inside_big_classes_equal_the_whole_class_sorted():
    ratios = parse_split_ratios("train=0.7,validation=0.2,test=0.1")
    # One class of 2,600 records (3 bucket bits: cuts fall inside buckets), small ones, a class of 1.
    records = [ImageRecord(f"/in/big/{i}", f"big/{i}", 1, ("big",)) for i in range(2600)]
    records += [ImageRecord(f"/in/s{i % 40}/{i}", f"s{i % 40}/{i}", 1, (f"s{i % 40}",)) for i in range(400)]
    records.append(ImageRecord("/in/one/x", "one/x", 1, ("one",)))
    by_class = collections.defaultdict(list)
    for r in records:
        by_class[r.class_key].append(r)
    expected = [(r.relpath, s) for group in by_class.values() for s, r in stratified_splits(group, 2, ratios)]
    counts = collections.Counter((rel.split("/")[0], s) for rel, s in expected)
    assert counts[("big", "train")] == 1820 and counts[("big", "test")] == 260 and counts[("s0", "test")] == 1
    with TestPipeline() as p:
        batches = [RecordBatch(tuple(records[i::4])) for i in range(4)]
        out = p | beam.Create(batches) | AssignSplits(ratios, seed=2, stratify=True)
        assert_that(
            out | beam.FlatMap(lambda b: [(r.relpath, r.split) for r in b.records]), equal_to(expected)
        )
