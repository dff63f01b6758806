"""The one-pass bucket counts of shard planning (cuts.histogram/coarsen, SegmentSummaryFn).

Shard planning counts each split's records at a fixed fine resolution in the same combiner
as its totals and coarsens that to the bits the totals give; the plan is exact whatever
that resolution (a coarser one only makes bigger straddling groups).
"""

import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.layout.test_layout import _skewed
from transforms.layout import beam as layout_beam
from transforms.layout import cuts
from transforms.layout.beam import PlanShards
from transforms.layout.plan import plan_shards
from transforms.records import RecordBatch


def test_fine_histogram_coarsened_equals_a_count_at_the_coarse_bits():
    rng = random.Random(5)
    hashes = np.array([rng.getrandbits(64) for _ in range(3000)], dtype=np.uint64)
    weights = np.array([rng.randint(1, 10**9) for _ in range(3000)], dtype=np.int64)
    ones = np.ones(3000, dtype=np.int64)
    # Per-batch histograms merged, as the combiner does.
    parts = [
        cuts.histogram(cuts.bucket_array(hashes[i : i + 700], 16), ones[i : i + 700], weights[i : i + 700])
        for i in range(0, 3000, 700)
    ]
    fine = cuts.merge_histograms(parts)
    assert fine[0].tolist() == sorted(set(fine[0].tolist())) and int(fine[1].sum()) == 3000
    for bits in (1, 5, 12, 16):
        expected: dict = {}
        for h, w in zip(hashes.tolist(), weights.tolist()):
            cuts.add_totals(expected, cuts.bucket_of(h, bits), w)
        assert cuts.coarsen(fine, 16, bits) == {b: tuple(v) for b, v in expected.items()}, bits


@pytest.mark.parametrize("fine_bits", [2, 16])
def test_plan_is_exact_when_the_fine_resolution_caps_the_bucket_bits(monkeypatch, fine_bits):
    """5,000 shards want 16 bucket bits: capped at 2, every cut falls in one of 4 buckets."""
    monkeypatch.setattr(layout_beam, "_FINE_BITS", fine_bits)
    records = _skewed(2000)
    expected = [
        (split, tuple(r.relpath for r in shard))
        for split in ("train", "validation")
        for shard in plan_shards([r for r in records if r.split == split], 11, None, 300)
    ]
    with TestPipeline() as p:
        batches = [RecordBatch(tuple(records[i : i + 250])) for i in range(0, len(records), 250)]
        tasks = p | beam.Create(batches) | PlanShards(seed=11, target_bytes=None, num_shards=300)
        ordered = (
            tasks
            | beam.Map(lambda t: (t.split, t.index, tuple(r.relpath for r in t.records)))
            | beam.combiners.ToList()
            | beam.Map(lambda ts: [(s, rels) for s, _, rels in sorted(ts, key=lambda t: (t[0], t[1]))])
        )
        assert_that(ordered, equal_to([expected]))
