"""The labels join as a user pays for it: `img2tfrecord convert` with a labels table vs folder labels.

    python benchmarks/label_join.py                        # 100,000 images, 1,000,000-row table, 3 rounds
    python benchmarks/label_join.py --rounds 5 --against /path/to/other/checkout   # A/B, interleaved
    python benchmarks/label_join.py --classes 1000000 --against /path/to/other/checkout

The images are identical 633-byte JPEGs in 100 class folders (memory.py's tiny dataset, cached
in benchmarks/work/); the table (`id,label`, cached too) holds one row per image (its stem and
its class folder's name, so both runs write the same dataset) and `--orphans` rows whose keys
match no image, spread through the table (every tenth row is an image's at the default sizes).
Each round runs every variant once, back to back, in a rotated order: `folders` (class folders)
and `table` (`--labels`), for this checkout and, with `--against DIR`, for DIR's checkout with
its own `.venv` (old vs new CLI side by side). Every run is a whole process measured by
measure.py (wall, CPU of the tree, peak RSS of the tree).

Printed: per variant the medians over the rounds; per checkout the extra wall and peak RSS of
`table` over `folders` (each the median of the differences taken within a round) and the table
rows per second of extra wall; with --against, the ratio of this checkout's extra wall to the
other's (median of the per-round ratios, with its range). The load average is printed before
and after each round. Each table run is checked: every image written, every orphan row in
orphan_labels.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from measure import run_measured  # noqa: E402
from memory import TINY_CLASSES, tiny_dataset  # noqa: E402

WORK_DIR = os.path.join(HERE, "work")


def write_table(path: str, images: int, orphans: int) -> str:
    """`id,label` rows: each image's stem and class, and `orphans` rows of keys no image has,
    spread evenly through the table (cached by its sizes)."""
    if os.path.exists(path):
        return path
    tmp = path + ".tmp"
    total = images + orphans
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("id,label\n")
        image, orphan = 0, 0
        lines = []
        for i in range(total):
            # Image rows at evenly spaced places (i * images // total changes): 1 in 10 at 100k/1M.
            if image < images and (i + 1) * images // total > image:
                lines.append(f"img_{image:07d},class_{image % TINY_CLASSES:03d}\n")
                image += 1
            else:
                lines.append(f"ORPHAN_{orphan:08d},class_{orphan % TINY_CLASSES:03d}\n")
                orphan += 1
            if len(lines) >= 100_000:
                f.writelines(lines)
                lines = []
        f.writelines(lines)
    os.replace(tmp, path)
    return path


def commands(python: str, data: str, table: str, out: str) -> dict[str, list[str]]:
    # -P: the checkout's code from PYTHONPATH, never the current folder's (python -m puts it first).
    convert = [python, "-P", "-m", "beam_pipeline", "convert", "--input", data, "--overwrite", "--quiet"]
    return {
        "folders": convert + ["--output_dir", f"{out}-folders"],
        "table": convert + ["--output_dir", f"{out}-table", "--labels", table, "--label_column", "label"],
    }


def check_table_run(out: str, images: int, orphans: int) -> None:
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(out, "orphan_labels.jsonl"), "rb") as f:
        written_orphans = sum(1 for _ in f)
    if summary["written"] != images or written_orphans != orphans:
        raise SystemExit(
            f"{out}: wrote {summary['written']} of {images} images, {written_orphans} of {orphans} orphans"
        )


def class_map_runs(args, checkouts: dict[str, str]) -> int:
    """--classes N: 3 images labelled by ids 0-2 of an id,name --label_map of N classes (~70-
    character names, as GLDv2's train_label_to_category.csv) against a 3-class map: peak RSS,
    summary.json and labels.txt sizes per checkout, and whether labels.txt is byte-identical
    across checkouts."""
    import random
    import string

    from PIL import Image

    root = os.path.join(args.work_dir, "class-map")
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    for i in range(3):
        Image.new("RGB", (8, 8), (i * 80, 30, 200)).save(os.path.join(root, "images", f"img{i}.png"))
    with open(os.path.join(root, "labels.csv"), "w") as f:
        f.write("id,label\n" + "".join(f"img{i},{i}\n" for i in range(3)))
    rnd = random.Random(0)
    letters = string.ascii_letters + "_()0123456789"
    maps = {}
    for n in (3, args.classes):
        maps[n] = os.path.join(root, f"map-{n}.csv")
        if not os.path.exists(maps[n]):
            with open(maps[n], "w") as f:
                f.write("landmark_id,category\n")
                for i in range(n):
                    f.write(
                        f"{i},http://commons.wikimedia.org/wiki/Category:{''.join(rnd.choice(letters) for _ in range(27))}\n"
                    )
    labels = {}
    for name, repo in checkouts.items():
        for n, label_map in maps.items():
            out = os.path.join(root, f"out-{name}-{n}")
            cmd = [os.path.join(repo, ".venv", "bin", "python"), "-P", "-m", "beam_pipeline", "convert"]
            cmd += ["--input", os.path.join(root, "images"), "--output_dir", out, "--overwrite", "--quiet"]
            cmd += ["--labels", os.path.join(root, "labels.csv"), "--label_map", label_map]
            m = run_measured(cmd, env={**os.environ, "PYTHONPATH": repo}, log_path=out + ".log")
            if m.returncode:
                raise SystemExit(f"{name} with {n} classes failed; see {out}.log")
            with open(os.path.join(out, "labels.txt"), "rb") as f:
                labels[name, n] = f.read()
            summary = os.path.getsize(os.path.join(out, "summary.json"))
            print(
                f"{name:>4} {n:>9,} classes: wall {m.wall_s:6.1f} s, CPU {m.cpu_s:6.1f} s, peak RSS {m.peak_rss_mb:6.0f} MB, "
                f"summary.json {summary:,} bytes, labels.txt {len(labels[name, n]):,} bytes, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if len(checkouts) > 1:
        same = all(labels["new", n] == labels["old", n] for n in maps)
        print(f"labels.txt byte-identical across checkouts: {same}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--orphans", type=int, default=900_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--against", metavar="DIR", help="Another checkout (with its .venv) to alternate with."
    )
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--only", default="", help="Comma-separated variants to run (default: all).")
    parser.add_argument(
        "--classes", type=int, help="Instead: 3 images with an N-class --label_map vs a 3-class one."
    )
    args = parser.parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    if args.classes:
        checkouts = {"new": REPO, **({"old": os.path.abspath(args.against)} if args.against else {})}
        return class_map_runs(args, checkouts)
    data = tiny_dataset(args.images, args.work_dir)
    table = write_table(
        os.path.join(args.work_dir, f"labels-{args.images}-{args.orphans}.csv"), args.images, args.orphans
    )
    checkouts = {"new": REPO}
    if args.against:
        checkouts["old"] = os.path.abspath(args.against)
    variants: dict[str, tuple[str, list[str]]] = {}
    for name, repo in checkouts.items():
        python = os.path.join(repo, ".venv", "bin", "python")
        out = os.path.join(args.work_dir, f"label-join-{name}")
        for kind, cmd in commands(python, data, table, out).items():
            variants[f"{kind}@{name}"] = (repo, cmd)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    names = list(variants)
    results: dict[str, list] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        load = os.getloadavg()[0]
        for name in order:
            repo, cmd = variants[name]
            subprocess.run(["sync"], check=False)
            log = os.path.join(args.work_dir, f"label-join-{name}.log")
            m = run_measured(cmd, env={**os.environ, "PYTHONPATH": repo}, log_path=log)
            if m.returncode:
                raise SystemExit(f"{name} failed ({m.returncode}); see {log}")
            if name.startswith("table"):
                check_table_run(cmd[cmd.index("--output_dir") + 1], args.images, args.orphans)
            results[name].append(m)
            print(
                f"round {r + 1} {name:>14}: wall {m.wall_s:6.1f} s, CPU {m.cpu_s:6.1f} s, peak RSS {m.peak_rss_mb:6.0f} MB",
                flush=True,
            )
        print(f"round {r + 1}: load {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    for name in checkouts:
        shutil.rmtree(os.path.join(args.work_dir, f"label-join-{name}-folders"), ignore_errors=True)
        shutil.rmtree(os.path.join(args.work_dir, f"label-join-{name}-table"), ignore_errors=True)
    print()
    print(
        f"{'variant':>14} {'wall s':>7} {'CPU s':>7} {'peak RSS MB':>11}   (medians of {args.rounds} rounds)"
    )
    for name in names:
        ms = results[name]
        print(
            f"{name:>14} {statistics.median(m.wall_s for m in ms):7.1f} {statistics.median(m.cpu_s for m in ms):7.1f} "
            f"{statistics.median(m.peak_rss_mb for m in ms):11.0f}"
        )
    rows = args.images + args.orphans
    extra: dict[str, list[float]] = {}
    for name in checkouts:
        tables, folders = results.get(f"table@{name}"), results.get(f"folders@{name}")
        if not tables or not folders:
            continue
        extra[name] = [t.wall_s - f.wall_s for t, f in zip(tables, folders)]
        rss = [t.peak_rss_mb - f.peak_rss_mb for t, f in zip(tables, folders)]
        cpu = [t.cpu_s - f.cpu_s for t, f in zip(tables, folders)]
        wall = statistics.median(extra[name])
        print(
            f"{name}: table - folders: wall {wall:+.1f} s (rounds {', '.join(f'{x:+.1f}' for x in extra[name])}), "
            f"CPU {statistics.median(cpu):+.1f} s, peak RSS {statistics.median(rss):+.0f} MB; "
            f"{rows / max(wall, 1e-9):,.0f} table rows / s of extra wall"
        )
    if "old" in extra and "new" in extra:
        ratios = [n / o for n, o in zip(extra["new"], extra["old"]) if o > 0]
        if ratios:
            print(
                f"extra wall new / old: {statistics.median(ratios):.2f} (rounds {min(ratios):.2f} .. {max(ratios):.2f})"
            )
        walls = [n.wall_s / o.wall_s for n, o in zip(results["table@new"], results["table@old"])]
        print(
            f"table wall new / old: {statistics.median(walls):.2f} (rounds {min(walls):.2f} .. {max(walls):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
