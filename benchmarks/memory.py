"""Peak RSS of `img2tfrecord convert` at 1x and 4x the images: memory must stay flat.

    python benchmarks/memory.py                # 4,000 vs 16,000 JPEGs, 3 rounds
    python benchmarks/memory.py --count 2000 --rounds 5

The 4x dataset is the generated one of run.py (cached); the 1x dataset is its first quarter,
as hard links. Each round converts both (interleaved, whole processes, default settings,
--quiet) and samples the process tree's resident memory (measure.py). Prints the median
peak RSS of each and the ratio 4x / 1x; the goal (issue 4) is at most 1.15.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from dataset import WORK_DIR, dataset_bytes, subset  # noqa: E402
from measure import run_measured  # noqa: E402

GOAL = 1.15


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4_000, help="Images of the 1x dataset.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--flags", default="", help="Extra convert flags, e.g. '--read_threads 1'.")
    args = parser.parse_args(argv)

    sizes = {"1x": args.count, "4x": 4 * args.count}
    data = {name: subset(n, 4 * args.count, work_dir=args.work_dir) for name, n in sizes.items()}
    out = os.path.join(args.work_dir, "memory-out")
    env = {**os.environ, "PYTHONPATH": REPO}
    peaks: dict[str, list[float]] = {name: [] for name in sizes}
    for r in range(args.rounds):
        for name in sizes:
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            cmd = [sys.executable, "-m", "beam_pipeline", "convert", "--input", data[name]]
            cmd += ["--output_dir", out, "--quiet", *args.flags.split()]
            m = run_measured(cmd, env=env, log_path=os.path.join(args.work_dir, f"memory-{name}-{r}.log"))
            if m.returncode:
                sys.exit(f"convert of {name} failed with status {m.returncode}")
            peaks[name].append(m.peak_rss_mb)
            print(
                f"round {r + 1}/{args.rounds} {name}: peak RSS {m.peak_rss_mb:.0f} MB, {m.wall_s:.1f} s",
                flush=True,
            )
    shutil.rmtree(out, ignore_errors=True)

    print()
    print(f"{'dataset':8} {'images':>7} {'MB':>6} {'median peak RSS MB':>19}")
    for name in sizes:
        n, total = dataset_bytes(data[name])
        print(f"{name:8} {n:7} {total / 1e6:6.0f} {statistics.median(peaks[name]):19.0f}")
    ratio = statistics.median(peaks["4x"]) / statistics.median(peaks["1x"])
    verdict = "meets" if ratio <= GOAL else "MISSES"
    print(f"peak RSS ratio 4x / 1x: {ratio:.3f} ({verdict} the goal of <= {GOAL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
