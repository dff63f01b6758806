"""The real graph at GLDv2 sizes on the local runner: wall, peak RSS and the largest group.

    python benchmarks/scale.py                                   # 0.1 M and 0.4 M images
    python benchmarks/scale.py --sizes 100000,400000,1600000,4132914
    python benchmarks/scale.py --sizes 100000 --labels           # labels from a train.csv
    py-spy record -o plan.svg -- python benchmarks/scale.py --one 100000 --plan_only --result r.json
                                                                 # a profile of the planning alone
    python benchmarks/scale.py --sizes 100000,4132914 --spread 1100  # planned shard sizes only

Each size is one `convert` (main.run, whole process, measured by measure.py) of generated
metadata: image names and sizes in a GLDv2-like long tail over 203,094 classes (class
c = floor(203094 * u**2) for a uniform u: the head class holds ~0.2% of the images, the
tail a few each at 4.1 M), ~40-200 KB each (~120 KB mean, so ~1,100 images a 128 MB shard),
split train=0.9,validation=0.1 with --stratify. Only the listing and the image reads are
replaced, through build_pipeline's seams (not flags): the listing by generated FileBatches,
the reads by a fixed 6x6 JPEG (so the shards hold tiny images, planned at the listed sizes).
With --labels the classes come from a generated `id,url,landmark_id` table joined by the
image's stem (ReadLabels + JoinLabels), the images in GLDv2's a/b/c/<id>.jpg folders.

Reports per size: wall, peak RSS, the time to the first image read (listing, labels,
splits and shard planning: the local runner runs those stages before any write), planning
throughput (images / that time), and from Beam distribution metrics the largest group any
GroupByKey of ours saw (batching.group_size). Targets (issue 14): the largest group does not
grow with N; wall 4.1 M / 0.1 M <= 45x; planning >= 100,000 images/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from measure import run_measured  # noqa: E402

WORK_DIR = os.path.join(HERE, "work")
CLASSES = 203_094
CHUNK = 1000  # generated images per FileBatch, as the listing batches them
DEFAULT_SIZES = "100000,400000"


def _chunk_rng(chunk: int) -> random.Random:
    return random.Random(1_000_003 * chunk + 7)


def generated_chunk(chunk: int, total: int, gldv2_folders: bool) -> list[tuple[str, str, int, int]]:
    """(relpath, image id, size, class) of images chunk*CHUNK .. of `total`: the same on every call."""
    rng = _chunk_rng(chunk)
    out = []
    for _ in range(chunk * CHUNK, min(total, (chunk + 1) * CHUNK)):
        image_id = f"{rng.getrandbits(64):016x}"
        cls = int(CLASSES * rng.random() ** 2)
        size = rng.randint(40_000, 200_000)
        folder = "/".join(image_id[:3]) if gldv2_folders else f"{cls:06d}"
        out.append((f"{folder}/{image_id}.jpg", image_id, size, cls))
    return out


class ListGenerated:
    """build_pipeline's list_files seam: ListedImages whose files are FileBatches of generated
    names, one per CHUNK images (no listing failures, no sample labels)."""

    def __init__(self, total: int, gldv2_folders: bool):
        self.total, self.gldv2_folders = total, gldv2_folders

    def __call__(self, p):
        import apache_beam as beam

        from transforms.failures import Failure
        from transforms.listing.beam import ListedImages
        from transforms.records import FileBatch

        total, folders = self.total, self.gldv2_folders

        def batch(chunk: int) -> FileBatch:
            # As columns (no ImageFile object per image): the seam costs little of the CPU measured.
            rows = generated_chunk(chunk, total, folders)
            relpaths = tuple([rel for rel, _, _, _ in rows])
            return FileBatch.from_columns(
                tuple([f"/gldv2/train/{rel}" for rel in relpaths]), relpaths, tuple([row[2] for row in rows])
            )

        chunks = -(-total // CHUNK)
        files = (
            p
            | "GenerateChunks" >> beam.Create(range(chunks))
            | "Spread" >> beam.Reshuffle()
            | "GenerateFiles" >> beam.Map(batch).with_output_types(FileBatch)
        )
        failed = p | "NoListingFailures" >> beam.Create([]).with_output_types(Failure)
        no_labels = p | "NoSampleLabels" >> beam.Create([]).with_output_types(tuple)
        return ListedImages(files=files, failed=failed, sample_labels=no_labels)


def tiny_jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (6, 6), (120, 30, 200)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class TinyReader:
    """build_pipeline's reader seam: every image is the same tiny JPEG; the first read of the
    run (in any process) leaves in `clock_path` its time and the CPU seconds the runner's
    process (`main_pid`) had used by then (/proc: the stages before the writes)."""

    def __init__(self, data: bytes, clock_path: str, main_pid: int, stop: bool = False):
        self.data, self.clock_path, self.main_pid = data, clock_path, main_pid
        self.stop = stop  # --plan_only: end the run at the first read (planning alone, for a profiler)
        self._seen = False

    def _cpu(self) -> float:
        with open(f"/proc/{self.main_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __call__(self, path: str) -> bytes:
        if not self._seen:
            self._seen = True
            try:
                fd = os.open(self.clock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, f"{time.time()!r} {self._cpu()!r}".encode())
                os.close(fd)
            except FileExistsError:
                pass
            if self.stop:
                os.kill(self.main_pid, signal.SIGKILL)
        return self.data


def write_table(path: str, total: int) -> None:
    """GLDv2's train.csv shape: id,url,landmark_id for every generated image."""
    if os.path.exists(path):
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("id,url,landmark_id\n")
        for chunk in range(-(-total // CHUNK)):
            f.writelines(
                f"{image_id},http://example.invalid/{image_id}.jpg,{cls}\n"
                for _, image_id, _, cls in generated_chunk(chunk, total, True)
            )
    os.replace(tmp, path)


def run_one(total: int, out: str, labels: str | None, clock: str, plan_only: bool = False) -> dict:
    """One conversion in this process; returns what the parent tabulates."""
    from apache_beam.metrics.metric import MetricsFilter

    from beam_pipeline import main
    from transforms.batching import GROUP_SIZE_NAMESPACE

    root = os.path.join(WORK_DIR, "scale-input")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "unused"))
    # --input must hold an image in a class folder (the pre-flight checks); it is not listed.
    name = generated_chunk(0, total, True)[0][1] if labels else "unused"  # with --labels: a key of the table
    with open(os.path.join(root, "unused", name + ".jpg"), "wb") as f:
        f.write(tiny_jpeg())
    args = ["--input", root, "--output_dir", out, "--quiet", "--overwrite"]
    args += ["--splits", "train=0.9,validation=0.1", "--stratify"]
    if labels:
        args += ["--labels", labels, "--key_column", "id", "--label_column", "landmark_id"]
    seams = {
        "list_files": ListGenerated(total, bool(labels)),
        "reader": TinyReader(tiny_jpeg(), clock, os.getpid(), stop=plan_only),
    }
    results = []
    cpu_start = TinyReader(b"", "", os.getpid())._cpu()
    start = time.time()
    summary = main.run(args, save_main_session=False, on_result=results.append, graph_seams=seams)
    wall = time.time() - start
    with open(clock) as f:
        when, cpu = map(float, f.read().split())
    first_read, first_read_cpu = when - start, cpu - cpu_start
    largest: dict[str, int] = {}
    for d in results[0].metrics().query(MetricsFilter())["distributions"]:
        if d.key.metric.namespace == GROUP_SIZE_NAMESPACE and d.committed and d.committed.count:
            largest[d.key.metric.name] = max(largest.get(d.key.metric.name, 0), d.committed.max)
    return {
        "images": total,
        "written": summary["written"],
        "failed": summary["failed"],
        "classes": summary["num_classes"],
        "shards": {s: e["shards"] for s, e in summary["splits"].items()},
        "wall_s": wall,
        "first_read_s": first_read,
        "first_read_cpu_s": first_read_cpu,
        "largest": largest,
    }


def shard_spread(total: int, records_a_shard: int) -> None:
    """Prints, per split, how far each shard but the last is from the target in the plan of
    `total` generated images (PlanShards' arithmetic, transforms/layout/plan.py, on the whole
    split at once) with a target of `records_a_shard` mean records: the weight ranges planned,
    and for comparison TFDS's equal hash ranges (get_bucket_number)."""
    import numpy as np

    from transforms.layout import plan
    from transforms.records import RecordBatch

    rows = [row for chunk in range(-(-total // CHUNK)) for row in generated_chunk(chunk, total, False)]
    relpaths = tuple(rel for rel, _, _, _ in rows)
    hashes = plan.record_hashes(relpaths, plan.DEFAULT_SEED)
    split_hashes, shuffle_hashes = plan.hash_columns(hashes)
    ratios = plan.parse_split_ratios("train=0.9,validation=0.1")
    splits = tuple(ratios[i][0] for i in plan.split_indexes(split_hashes, ratios))
    batch = RecordBatch.from_columns(
        tuple("/gldv2/" + rel for rel in relpaths),
        relpaths,
        tuple(r[2] for r in rows),
        tuple((str(r[3]),) for r in rows),
        splits,
        ((),) * total,
    ).with_columns(hashes=hashes, hash_seed=plan.DEFAULT_SEED)
    sizes, totals = plan.record_sizes(batch), dict(plan.split_weights(batch, 0))
    target = records_a_shard * int(sizes.mean())
    for name, _ in ratios:
        mine = np.array(splits) == name
        scale = plan.shard_scale(totals[name, plan.RECORDS], totals[name, plan.WEIGHTS], target, None)
        units = sizes[mine].sum() / target
        equal_hash = ((shuffle_hashes[mine] >> np.uint64(11)).astype(np.float64) * 2.0**-53 * units).astype(
            int
        )
        report = []
        for label, shards in (
            ("weight ranges", plan.shard_indexes(shuffle_hashes[mine], *scale)),
            ("hash ranges (TFDS)", np.minimum(equal_hash, scale[2])),
        ):
            off = np.bincount(shards, weights=sizes[mine])[:-1] / target - 1
            report.append(f"{label} {off.min():+.1%} .. {off.max():+.1%}")
        print(
            f"{total:>9} {name:>10}: {scale[2] + 1:5} shards of ~{records_a_shard} records; "
            + ", ".join(report)
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="Comma-separated image counts.")
    parser.add_argument("--labels", action="store_true", help="Labels from a generated train.csv.")
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one run, JSON to --result
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument(
        "--plan_only",
        action="store_true",
        help="With --one: end the run at the first image read (profile the planning alone: "
        "py-spy record -- python benchmarks/scale.py --one 100000 --plan_only --result r.json).",
    )
    parser.add_argument(
        "--spread",
        type=int,
        metavar="RECORDS",
        help="Only print each shard's planned bytes vs the target at --sizes, RECORDS records a shard.",
    )
    args = parser.parse_args(argv)
    if args.spread:
        for n in (int(s) for s in args.sizes.split(",")):
            shard_spread(n, args.spread)
        return 0
    os.makedirs(args.work_dir, exist_ok=True)
    if args.one:
        out = os.path.join(args.work_dir, "scale-out")
        clock = os.path.join(args.work_dir, "scale-first-read")
        if os.path.exists(clock):
            os.remove(clock)
        row = run_one(args.one, out, args.table, clock, args.plan_only)
        shutil.rmtree(out, ignore_errors=True)
        with open(args.result, "w") as f:
            json.dump(row, f)
        return 0

    rows = []
    env = {**os.environ, "PYTHONPATH": REPO}
    for n in (int(s) for s in args.sizes.split(",")):
        table = None
        if args.labels:
            table = os.path.join(args.work_dir, f"scale-train-{n}.csv")
            write_table(table, n)
        result = os.path.join(args.work_dir, f"scale-{n}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(n), "--result", result]
        cmd += ["--work_dir", args.work_dir] + (["--table", table] if table else [])
        load = os.getloadavg()[0]
        subprocess.run(["sync"], check=False)
        m = run_measured(cmd, env=env, log_path=os.path.join(args.work_dir, f"scale-{n}.log"))
        if m.returncode:
            sys.exit(f"scale run of {n} images failed ({m.returncode}); see {args.work_dir}/scale-{n}.log")
        with open(result) as f:
            row = json.load(f)
        row.update(peak_rss_mb=m.peak_rss_mb, cpu_s=m.cpu_s, load_before=load, load_after=os.getloadavg()[0])
        rows.append(row)
        largest = max(row["largest"].items(), key=lambda kv: kv[1])
        print(
            f"{n:>9} images: wall {m.wall_s:7.1f} s, to first read {row['first_read_s']:6.1f} s "
            f"(CPU {row['first_read_cpu_s']:.1f} s), peak RSS {m.peak_rss_mb:6.0f} MB, "
            f"largest group {largest[1]} ({largest[0]}), load {load:.1f} -> {row['load_after']:.1f}",
            flush=True,
        )
    print()
    print(
        f"{'images':>9} {'wall s':>7} {'CPU s':>7} {'peak RSS MB':>11} {'plan s':>7} {'plan CPU s':>10} {'img/CPU s':>9} {'shards':>7}  largest group per GroupByKey"
    )
    for r in rows:
        groups = ", ".join(
            f"{k.split('/', 1)[0]}/{k.rsplit('/', 1)[1]} {v}" for k, v in sorted(r["largest"].items())
        )
        print(
            f"{r['images']:>9} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['peak_rss_mb']:11.0f} {r['first_read_s']:7.1f} "
            f"{r['first_read_cpu_s']:10.1f} {r['images'] / r['first_read_cpu_s']:9.0f} {sum(r['shards'].values()):7}  {groups}"
        )
    if len(rows) > 1:
        print(
            f"wall {rows[-1]['images']} / {rows[0]['images']}: {rows[-1]['wall_s'] / rows[0]['wall_s']:.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
