"""Stratified splits in bounded groups (transforms/layout/strata.py), without Beam: the packs,
the group keys, and each group's splits against the whole class sorted (reference.stratified_splits)."""

import collections
import random

import numpy as np

from tests.layout.reference import seeded_hashes, stratified_splits
from transforms.layout import strata
from transforms.layout.plan import cumulative, parse_split_ratios
from transforms.records import ImageRecord

RATIOS = parse_split_ratios("train=0.7,validation=0.2,test=0.1")


def test_packs_hold_small_classes_whole_and_at_most_the_pack_size():
    rng = random.Random(3)
    totals = {
        f"c{i:04d}": n
        for i, n in enumerate(rng.choice((1, 2, 5, 40, 300, 512, 513, 9000)) for _ in range(2000))
    }
    index = strata.Packs(totals, 512)  # what KeyClassesFn reads: the packs' first names, the big classes
    packs = {name: index.pack_of(name) for name, n in totals.items() if n <= 512}
    held = collections.Counter()
    for name, pack in packs.items():
        held[pack] += totals[name]
    assert max(held.values()) <= 512 and len(held) > 1
    assert sum(held.values()) >= 0.5 * 512 * (len(held) - 1)  # filled, not one pack a class
    assert set(held) == set(range(len(index.firsts)))  # every pack holds its first class at least
    reordered = strata.Packs(dict(reversed(list(totals.items()))), 512)  # order of the totals
    assert {name: reordered.pack_of(name) for name in packs} == packs
    # Big classes are bucketed instead.
    assert index.big == {c: strata.class_bits(n, 512) for c, n in totals.items() if n > 512}


def _records(sizes, seed=0):
    rng = random.Random(seed)
    out = []
    for c, n in enumerate(sizes):
        out += [
            ImageRecord(f"/in/k{c}/{rng.getrandbits(40):x}.jpg", f"k{c}/{i}.jpg", 1, (f"k{c}",))
            for i in range(n)
        ]
    rng.shuffle(out)
    return out


def _splits_by_groups(records, seed, bucket):
    """Every record's split as the groups give it: keyed, gathered per key, placed."""
    totals = dict(collections.Counter(r.class_key for r in records))
    hashes = np.array([seeded_hashes(r.relpath, seed)[0] for r in records], dtype=np.uint64)
    codes, distinct = strata.group_keys([r.class_key for r in records], hashes, strata.Packs(totals, bucket))
    assert len(set(distinct)) == len(distinct) == len(set(codes.tolist()))
    keys = [distinct[c] for c in codes.tolist()]
    groups = collections.defaultdict(list)
    table: dict = {}
    for i, key in enumerate(keys):
        groups[key].append(i)
        if key[0] == strata._BUCKET:
            table[key[1:]] = table.get(key[1:], 0) + 1
    assert max(len(g) for k, g in groups.items() if k[0] == strata._PACK) <= bucket
    out = {}
    for (kind, name, number), members in groups.items():
        start = strata.bucket_starts(table)[name, number] if kind == strata._BUCKET else 0
        parts = strata.split_indexes_in_group(
            [records[i].class_key for i in members],
            hashes[members],
            [records[i].relpath for i in members],
            [records[i].path for i in members],
            totals if kind == strata._BUCKET else None,  # a pack: the counts of the group
            cumulative(RATIOS),
            start,
        )
        out.update((records[i].relpath, RATIOS[p][0]) for i, p in zip(members, parts.tolist()))
    return out


def test_groups_place_every_record_as_the_whole_class_sorted():
    records = _records([1, 2, 3, 7, 10, 64, 100, 30, 1, 1, 700, 2600])  # two classes above the pack
    expected = {}
    by_class = collections.defaultdict(list)
    for r in records:
        by_class[r.class_key].append(r)
    for group in by_class.values():
        expected.update((r.relpath, s) for s, r in stratified_splits(group, 5, RATIOS))
    got = _splits_by_groups(records, 5, bucket=128)
    assert got == expected
    counts = collections.Counter((rel.split("/")[0], s) for rel, s in got.items())
    assert (counts[("k11", "train")], counts[("k11", "validation")], counts[("k11", "test")]) == (
        1820,
        520,
        260,
    )


def test_equal_hashes_in_a_class_are_ordered_by_relpath_then_path():
    hashes = np.array([5, 5, 5, 1], dtype=np.uint64)
    classes = ["a", "a", "a", "a"]
    relpaths, paths = ["z", "b", "b", "y"], ["/1", "/3", "/2", "/0"]
    # Order: (1, y), (5, b, /2), (5, b, /3), (5, z): ranks 0..3 of 4 at 0.5/0.25/0.25.
    parts = strata.split_indexes_in_group(classes, hashes, relpaths, paths, {"a": 4}, (0.5, 0.75, 1.0))
    assert parts.tolist() == [2, 1, 0, 0]
