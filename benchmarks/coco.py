"""COCO and box tables (issue 31): the annotation readers alone, and the Model Garden's
create_coco_tf_record.py as the peer on the same generated files. Whole processes, measured by
measure.py (wall, CPU of the process tree, peak RSS of the tree), interleaved rounds, medians.

    python benchmarks/coco.py reader                   # the COCO-sized file: 118,287 images, ~860,000 annotations
    python benchmarks/coco.py peer --images 20000      # create_coco_tf_record.py --include_masks on 20,000 JPEGs
    python benchmarks/coco.py boxes --rows 15000000    # an Open Images-like box table: parse + box_rows

- `reader`: each pass of transforms/labels/annotations/coco.py over the generated COCO-sized
  instances file (coco_data.instances) in a process of its own: the categories, the `images`
  (one row an image), the `annotations` without and with masks (JSON text of each
  segmentation); rows/s is the pass's rows over its wall time. Goal: peak RSS < 1.5 GB.
- `peer`: official/vision/data/create_coco_tf_record.py (tf-models-official 2.20, installed by
  `make peer` into .peer/, on PYTHONPATH for its run only) with --include_masks and its default
  pool (one process a core), on a dataset of real JPEGs with ~7 boxes and polygons an image
  (coco_data.dataset). The page cache is warmed before each run. It loads the whole
  instances file with json.load, and its pool's starmap collects every serialized Example
  before the first is written. (Our CLI on the same files joins this table once the
  annotation rows are joined to the images: issue 31's second step.)
- `boxes`: a CSV of N box rows (Open Images' columns, ~7 boxes an image), read as the labels
  table reader reads one (pyarrow.csv, 4 MB blocks, text cells) and converted batch by batch
  by box_table.BoxRows; rows/s over the whole process's wall. The join itself is the labels
  join's (issue 30).

Method and figures: benchmarks/README.md ("COCO and box tables").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from coco_data import WORK_DIR, dataset, instances  # noqa: E402
from measure import Measurement, aligned, run_measured  # noqa: E402
from run import REPO, _load, read_all  # noqa: E402

PEER_DIR = os.path.join(REPO, ".peer")
PASSES = ("categories", "images", "annotations", "annotations+masks", "json.load")


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


# --- the passes, each run in a process of its own (`coco.py _pass NAME PATH`) ---------------------


def run_pass(name: str, path: str) -> None:
    """One reader pass over `path`; prints its row count and the pass's own wall and CPU seconds.

    `json.load` is what Model Garden's converter does first (`_load_object_annotations`): the
    whole file as Python objects (its rows: the annotations)."""
    import json

    started, cpu = time.perf_counter(), time.process_time()
    if name == "json.load":
        with open(path, "rb") as f:
            rows = len(json.load(f)["annotations"])
        print(f"rows {rows} seconds {time.perf_counter() - started:.3f} cpu {time.process_time() - cpu:.3f}")
        return
    from transforms.labels.annotations import coco

    started, cpu = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        categories = coco.read_categories(f, path)
    rows = len(categories.ids)
    if name != "categories":
        started, cpu = time.perf_counter(), time.process_time()  # the categories are an input, not the pass
        with open(path, "rb") as f:
            if name == "images":
                batches = coco.image_rows(f, path)
            else:
                batches = coco.annotation_rows(f, categories, path, masks=name.endswith("+masks"))
            rows = sum(b.num_rows for b in batches)
    print(f"rows {rows} seconds {time.perf_counter() - started:.3f} cpu {time.process_time() - cpu:.3f}")


def _parse_pass_output(log: str) -> tuple[int, float, float]:
    """(rows, wall seconds, CPU seconds) a pass printed (CPU 0 where it printed none)."""
    with open(log) as f:
        words = f.read().split()
    cpu = float(words[words.index("cpu") + 1]) if "cpu" in words else 0.0
    return int(words[words.index("rows") + 1]), float(words[words.index("seconds") + 1]), cpu


def reader(args) -> None:
    path = instances(args.images, work_dir=args.work_dir)
    size_mb = os.path.getsize(path) / 1e6
    logs = os.path.join(args.work_dir, "coco-reader-logs")
    os.makedirs(logs, exist_ok=True)
    runs: dict[str, list[tuple[Measurement, int, float, float]]] = {name: [] for name in PASSES}
    print(f"load before: {_load()}")
    for r in range(args.rounds):
        order = PASSES if r % 2 == 0 else PASSES[::-1]
        for name in order:
            _warm(path)
            log = os.path.join(logs, f"{name}.log")
            cmd = [sys.executable, __file__, "_pass", name, path]
            m = run_measured(cmd, env=_env(), log_path=log)
            if m.returncode:
                sys.exit(f"pass {name} failed; see {log}")
            runs[name].append((m, *_parse_pass_output(log)))
    print(f"load after: {_load()}")
    lines = [
        (
            "pass",
            "rows",
            "pass wall s",
            "pass cpu s",
            "rows/s (wall)",
            "rows/s (cpu)",
            "process cpu s",
            "peak RSS MB",
        )
    ]
    for name, measured in runs.items():
        lines.append(
            (
                name,
                f"{measured[0][1]:,}",
                f"{statistics.median(s for _, _, s, _ in measured):.1f}",
                f"{statistics.median(c for _, _, _, c in measured):.1f}",
                f"{statistics.median(n / s for _, n, s, _ in measured):,.0f}",
                f"{statistics.median(n / c for _, n, _, c in measured):,.0f}",
                f"{statistics.median(m.cpu_s for m, *_ in measured):.1f}",
                f"{statistics.median(m.peak_rss_mb for m, *_ in measured):.0f}",
            )
        )
    print(f"\nmedians of {args.rounds} rounds, {path} ({size_mb:.0f} MB)")
    print(aligned(lines))


# --- the peer ------------------------------------------------------------------------------------


def peer_command(root: str, out: str, shards: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "official.vision.data.create_coco_tf_record",
        f"--image_dir={root}/images",
        f"--object_annotations_file={root}/instances.json",
        f"--output_file_prefix={out}/train",
        f"--num_shards={shards}",
        "--include_masks",
    ]


def peer(args) -> None:
    if not os.path.exists(os.path.join(PEER_DIR, ".installed")):
        subprocess.run(["make", "-C", REPO, "peer"], check=True)
    root = dataset(args.images, work_dir=args.work_dir)
    out = os.path.join(args.work_dir, "coco-peer-out")
    log = os.path.join(args.work_dir, "coco-peer.log")
    shards = max(1, args.images // 1000)
    measured: list[Measurement] = []
    print(f"load before: {_load()}")
    for _ in range(args.rounds):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        read_all(root)
        m = run_measured(peer_command(root, out, shards), env=_env(PYTHONPATH=PEER_DIR), log_path=log)
        if m.returncode:
            sys.exit(f"the peer failed with status {m.returncode}; see {log}")
        measured.append(m)
    print(f"load after: {_load()}")
    written = sum(1 for _ in _records(out))
    if written != args.images:
        sys.exit(f"the peer wrote {written} of {args.images} images; see {log}")
    lines = [("tool", "images", "wall s", "cpu s", "peak RSS MB", "walls")]
    lines.append(
        (
            "create_coco_tf_record",
            f"{args.images:,}",
            f"{statistics.median(m.wall_s for m in measured):.1f}",
            f"{statistics.median(m.cpu_s for m in measured):.1f}",
            f"{statistics.median(m.peak_rss_mb for m in measured):.0f}",
            " ".join(f"{m.wall_s:.1f}" for m in measured),
        )
    )
    print(f"\nmedians of {args.rounds} rounds, {root}")
    print(aligned(lines))


def _records(out: str):
    """The records of the peer's shards (framing read without TensorFlow: length, crc, data, crc)."""
    import struct

    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name), "rb") as f:
            while header := f.read(12):
                (length,) = struct.unpack("<Q", header[:8])
                f.seek(length + 4, os.SEEK_CUR)
                yield name


# --- box tables ----------------------------------------------------------------------------------


def write_box_table(path: str, rows: int) -> None:
    """An Open Images-like box table (~7 boxes an image), written in blocks."""
    import numpy as np

    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        f.write("ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            x = rng.random((n, 4)).round(6)
            images = (np.arange(start, start + n) // 7).tolist()
            labels = rng.integers(0, 600, n).tolist()
            f.write(
                "".join(
                    f"{i:016x},xclick,/m/{c:05d},1,{a},{b},{c2},{d}\n"
                    for i, c, (a, b, c2, d) in zip(images, labels, x.tolist())
                )
            )


def run_boxes(path: str) -> None:
    """The table read as the labels reader reads one, converted to rows batch by batch."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from transforms.labels.annotations.box_table import BoxRows, BoxTable

    convert = BoxRows(BoxTable("ImageID", "LabelName", ("XMin", "YMin", "XMax", "YMax"), "normalized"))
    with open(path, "rb") as f:
        header = f.readline().decode().strip().split(",")
    started, cpu, rows, line = time.perf_counter(), time.process_time(), 0, 2
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(use_threads=False, block_size=4 << 20),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string())),
    )
    for batch in reader:
        for start in range(0, batch.num_rows, 1000):
            part = batch.slice(start, 1000)
            rows += convert(part, path, pa.array(range(line, line + part.num_rows))).num_rows
            line += part.num_rows
    print(f"rows {rows} seconds {time.perf_counter() - started:.3f} cpu {time.process_time() - cpu:.3f}")


def _warm(path: str) -> None:
    """Reads a file (untimed), so that the run finds it in the page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def boxes(args) -> None:
    os.makedirs(args.work_dir, exist_ok=True)
    path = os.path.join(args.work_dir, f"boxes-{args.rows}.csv")
    if not os.path.exists(path):
        write_box_table(path + ".part", args.rows)
        os.replace(path + ".part", path)
    log = os.path.join(args.work_dir, "coco-boxes.log")
    runs = []
    print(f"load before: {_load()}")
    for _ in range(args.rounds):
        _warm(path)
        m = run_measured([sys.executable, __file__, "_boxes", path], env=_env(), log_path=log)
        if m.returncode:
            sys.exit(f"box rows failed; see {log}")
        runs.append((m, *_parse_pass_output(log)))
    print(f"load after: {_load()}")
    lines = [("step", "rows", "rows/s (wall)", "rows/s (cpu)", "process cpu s", "peak RSS MB")]
    lines.append(
        (
            "read + BoxRows",
            f"{runs[0][1]:,}",
            f"{statistics.median(n / s for _, n, s, _ in runs):,.0f}",
            f"{statistics.median(n / c for _, n, _, c in runs):,.0f}",
            f"{statistics.median(m.cpu_s for m, *_ in runs):.1f}",
            f"{statistics.median(m.peak_rss_mb for m, *_ in runs):.0f}",
        )
    )
    print(f"\nmedians of {args.rounds} rounds, {path} ({os.path.getsize(path) / 1e6:.0f} MB)")
    print(aligned(lines))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_pass":
        return run_pass(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "_boxes":
        return run_boxes(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("reader", "peer", "boxes"))
    parser.add_argument("--images", type=int, default=None, help="reader: 118,287; peer: 2,000")
    parser.add_argument("--rows", type=int, default=1_000_000, help="boxes: rows of the table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work_dir", default=WORK_DIR)
    args = parser.parse_args()
    if args.images is None:
        args.images = 118_287 if args.what == "reader" else 2000
    {"reader": reader, "peer": peer, "boxes": boxes}[args.what](args)


if __name__ == "__main__":
    main()
