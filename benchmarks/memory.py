"""Peak memory of `img2tfrecord convert` at 1x and 4x the images: memory must stay flat.

    python benchmarks/memory.py                # 4,000 vs 16,000 photo-like JPEGs, 3 rounds
    python benchmarks/memory.py --count 2000 --rounds 5
    python benchmarks/memory.py --tiny         # 25,000 vs 100,000 identical 633-byte JPEGs
    python benchmarks/memory.py --tiny --where # ... and where the runner's bytes are

The default 4x dataset is the generated one of run.py (cached); the 1x dataset is its
first quarter, as hard links. `--tiny` converts identical tiny JPEGs (16x16, 633 bytes) in
100 class folders instead (issue 14: 25,000 vs 100,000; generated in seconds, cached), where
the per-image metadata is all there is to hold. Each round converts both (interleaved,
whole processes, default settings, --quiet) and samples the process tree (measure.py):

- peak RSS: the runner's resident set plus its descendants' private pages (USS), summed
  at the same instant (forked writers share the runner's pages copy-on-write: their RSS
  would count those once per process). This is the figure of issue 14 and of earlier
  tables.
- peak PSS: the tree's proportional set size summed at the same instant (each shared page
  split among the processes that map it), a check on the first.
- per process: the runner's peak RSS and each writer's peak USS.

Prints the medians and the ratio 4x / 1x; the goals: at most 1.15 for the default
datasets (issue 4), at most 1.3 for `--tiny` (issue 14). `--where` then runs
runner_heap.py once per size (the runner's heap: allocators, Beam's buffers per
PCollection, our records alive; slower).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from dataset import WORK_DIR, dataset_bytes, subset  # noqa: E402
from measure import Measurement, aligned, run_measured  # noqa: E402

GOAL = 1.15
TINY_GOAL = 1.3
TINY_COUNT = 25_000
TINY_CLASSES = 100
_MARKER = ".complete"


def tiny_jpeg() -> bytes:
    """A 16x16 JPEG of one colour (633 bytes with Pillow 12)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 30, 200)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def tiny_dataset(count: int, work_dir: str = WORK_DIR) -> str:
    """`count` copies of tiny_jpeg() in TINY_CLASSES class folders (cached by count)."""
    root = os.path.join(work_dir, f"tiny-{count}")
    if os.path.exists(os.path.join(root, _MARKER)):
        return root
    data = tiny_jpeg()
    for c in range(TINY_CLASSES):
        os.makedirs(os.path.join(root, f"class_{c:03d}"), exist_ok=True)
    for i in range(count):
        with open(os.path.join(root, f"class_{i % TINY_CLASSES:03d}", f"img_{i:07d}.jpg"), "wb") as f:
            f.write(data)
    with open(os.path.join(root, _MARKER), "w") as f:
        f.write(f"{count} copies of a {len(data)}-byte JPEG\n")
    return root


def _per_process(m: Measurement) -> tuple[float, list[float]]:
    """(runner's peak RSS, each other process's peak USS), MB."""
    runner = next((p.rss_mb for p in m.processes if p.root), 0.0)
    return runner, [p.uss_mb for p in m.processes if not p.root]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--count", type=int, default=0, help="Images of the 1x dataset (4,000; --tiny 25,000)."
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--tiny", action="store_true", help="Identical 633-byte JPEGs in 100 class folders.")
    parser.add_argument("--where", action="store_true", help="Then run runner_heap.py on each dataset.")
    parser.add_argument("--flags", default="", help="Extra convert flags, e.g. '--read_threads 1'.")
    args = parser.parse_args(argv)

    count = args.count or (TINY_COUNT if args.tiny else 4_000)
    sizes = {"1x": count, "4x": 4 * count}
    if args.tiny:
        data = {name: tiny_dataset(n, args.work_dir) for name, n in sizes.items()}
    else:
        data = {name: subset(n, 4 * count, work_dir=args.work_dir) for name, n in sizes.items()}
    out = os.path.join(args.work_dir, "memory-out")
    env = {**os.environ, "PYTHONPATH": REPO}
    runs: dict[str, list[Measurement]] = {name: [] for name in sizes}
    for r in range(args.rounds):
        for name in sizes:
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            cmd = [sys.executable, "-m", "beam_pipeline", "convert", "--input", data[name]]
            cmd += ["--output_dir", out, "--quiet", *args.flags.split()]
            log = os.path.join(args.work_dir, f"memory-{name}-{r}.log")
            m = run_measured(cmd, env=env, log_path=log, per_process=True)
            if m.returncode:
                sys.exit(f"convert of {name} failed with status {m.returncode}")
            runs[name].append(m)
            runner, others = _per_process(m)
            print(
                f"round {r + 1}/{args.rounds} {name}: peak RSS {m.peak_rss_mb:.0f} MB (PSS {m.peak_pss_mb:.0f};"
                f" runner {runner:.0f}, others' USS {' '.join(f'{u:.0f}' for u in others)}), {m.wall_s:.1f} s",
                flush=True,
            )
    shutil.rmtree(out, ignore_errors=True)

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.0f}"

    rows = [
        ("dataset", "images", "MB", "peak RSS", "peak PSS", "runner RSS", "writer USS", "wall s", "CPU s")
    ]
    for name in sizes:
        n, total = dataset_bytes(data[name])
        ms = runs[name]
        writers = [max(_per_process(m)[1], default=0.0) for m in ms]
        rows.append(
            (
                name,
                str(n),
                f"{total / 1e6:.0f}",
                med([m.peak_rss_mb for m in ms]),
                med([m.peak_pss_mb for m in ms]),
                med([_per_process(m)[0] for m in ms]),
                med(writers),
                f"{statistics.median(m.wall_s for m in ms):.1f}",
                f"{statistics.median(m.cpu_s for m in ms):.1f}",
            )
        )
    print(f"\nmedians of {args.rounds} rounds (MB; writer USS: the largest writer's)")
    print(aligned(rows))
    goal = TINY_GOAL if args.tiny else GOAL
    ratio = statistics.median(m.peak_rss_mb for m in runs["4x"]) / statistics.median(
        m.peak_rss_mb for m in runs["1x"]
    )
    pss = statistics.median(m.peak_pss_mb for m in runs["4x"]) / statistics.median(
        m.peak_pss_mb for m in runs["1x"]
    )
    verdict = "meets" if ratio <= goal else "MISSES"
    print(f"peak RSS ratio 4x / 1x: {ratio:.3f} ({verdict} the goal of <= {goal}); peak PSS ratio {pss:.3f}")
    if args.where:
        for name in sizes:
            print(f"\n== where the runner's bytes are: {name} ({sizes[name]} images)", flush=True)
            subprocess.run(
                [
                    sys.executable,
                    os.path.join(HERE, "runner_heap.py"),
                    data[name],
                    "--images",
                    str(sizes[name]),
                ],
                env=env,
                check=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
