"""No GroupByKey group of ours grows with the number of images (issue 14, "Done when").

The graph runs on real images at two sizes (1x and 4x); every GroupByKey of ours reports the
records of each group to a Beam distribution (batching.group_size), read from the run's
metrics. Shard planning groups one shard's records; stratified splits a pack of small classes of up to 512 images in
all (here PACK = 16 records: one class of 10 a pack), or one bucket of a larger class; dedupe
the copies of one content. The labels join (GroupByBucket) is bounded
by its bucket size (transforms/labels/beam_table.py) and is not run here.
"""

import collections

from apache_beam.metrics.metric import MetricsFilter

from beam_pipeline import main
from tests.conftest import read_records, write_image
from transforms.batching import GROUP_SIZE_NAMESPACE
from transforms.layout import beam_strata

PER_CLASS = 10  # images per class: a class is placed whole in its stratify group
PER_SHARD = 16  # records per shard: every record weighs the same, so shards are exact
PACK = PER_SHARD  # records a pack of small classes holds at most (512 in a real run): one class of 10
NAME_WIDTH = 4


def _dataset(root, classes):
    """`classes` classes of PER_CLASS random 6x6 BMPs: every file and relpath the same length."""
    for c in range(classes):
        for i in range(PER_CLASS):
            write_image(root / f"c{c:03d}" / f"{i:0{NAME_WIDTH}d}.bmp", (6, 6), seed=c * 100 + i)
    return root


def _largest_groups(root, out) -> tuple[dict[str, int], dict]:
    one = next(root.glob("*/*.bmp"))
    relpath = f"{one.parent.name}/{one.name}"
    # record_size (transforms/layout/beam.py): file size + relpath + label + 250 bytes.
    weight = one.stat().st_size + len(relpath) + len(one.parent.name) + 250
    shard_mb = PER_SHARD * weight / 2**20  # exact in binary: int(mb * 2**20) == PER_SHARD * weight
    results = []
    args = ["--input", str(root), "--output_dir", str(out), "--quiet", "--shard_size_mb", repr(shard_mb)]
    args += ["--stratify", "--splits", "train=0.8,test=0.2", "--dedupe", "--seed", "3"]
    summary = main.run(args, save_main_session=False, on_result=results.append)
    dists = results[0].metrics().query(MetricsFilter())["distributions"]
    largest: dict[str, int] = collections.defaultdict(int)
    for d in dists:
        if d.key.metric.namespace == GROUP_SIZE_NAMESPACE:
            step = d.key.metric.name
            largest[step] = max(largest[step], d.committed.max)
    return dict(largest), summary


def test_largest_group_is_the_same_at_1x_and_4x(tmp_path, monkeypatch):
    monkeypatch.setattr(beam_strata, "_SPLIT_BUCKET", PACK)  # read when the graph is built
    small = _largest_groups(_dataset(tmp_path / "1x", 6), tmp_path / "out1")
    large = _largest_groups(_dataset(tmp_path / "4x", 24), tmp_path / "out4")
    (g1, s1), (g4, s4) = small, large
    assert s1["written"] == 60 and s4["written"] == 240 and s4["failed"] == 0
    # Every GroupByKey of ours ran at both sizes and reported its groups.
    steps = {
        "PlanShards/GroupByShard",
        "AssignSplits/CutClasses/GroupClasses",
        "DropDuplicates/GroupByContent",
    }
    assert set(g1) == set(g4) == steps, (g1, g4)
    # The largest group anywhere is one shard, the same at 1x and 4x.
    assert max(g1.values()) == max(g4.values()) == PER_SHARD, (g1, g4)
    assert g1["PlanShards/GroupByShard"] == g4["PlanShards/GroupByShard"] == PER_SHARD
    # Classes are packed whole, at most PACK records a group: one class of 10 at both sizes.
    assert (
        g1["AssignSplits/CutClasses/GroupClasses"] == g4["AssignSplits/CutClasses/GroupClasses"] == PER_CLASS
    )
    assert g1["DropDuplicates/GroupByContent"] == g4["DropDuplicates/GroupByContent"] == 1
    # What the groups are for still holds at 4x: each class cut 8/2, shards exact.
    for cls, counts in s4["splits"]["test"]["classes"].items():
        assert counts["written"] == 2, cls
    assert s4["splits"]["train"]["shards"] == 192 // PER_SHARD
    train = read_records(tmp_path / "out4", "train")
    assert len(train) == 192 and len({r["filename"] for r in train}) == 192


def test_stratified_plan_is_byte_identical_on_one_and_two_workers(tmp_path):
    """The plan (split totals, class counts, bucket table) does not depend on how bundles fall."""
    import filecmp
    import os

    root = _dataset(tmp_path / "in", 6)
    common = ["--input", str(root), "--quiet", "--shard_size_mb", "0.004", "--seed", "9"]
    common += ["--stratify", "--splits", "train=0.7,validation=0.2,test=0.1"]
    main.run(
        common + ["--output_dir", str(tmp_path / "a"), "--direct_num_workers", "1"], save_main_session=False
    )
    main.run(
        common + ["--output_dir", str(tmp_path / "b"), "--direct_num_workers", "2"], save_main_session=False
    )
    names = sorted(os.listdir(tmp_path / "a"))
    assert (
        names == sorted(os.listdir(tmp_path / "b")) and len([n for n in names if n.startswith("train-")]) >= 3
    )
    for name in names:
        assert filecmp.cmp(tmp_path / "a" / name, tmp_path / "b" / name, shallow=False), name
