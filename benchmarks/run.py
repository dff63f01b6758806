"""Benchmark of `img2tfrecord convert` against `cat` and the TensorFlow tutorial loop.

    python benchmarks/run.py                 # 16,000 JPEGs (~700 MB), 3 rounds
    python benchmarks/run.py --rounds 5 --variant inmem="--direct_running_mode=in_memory --direct_num_workers=1"
    python benchmarks/run.py --cold          # the files read from the disk by every tool

Generates the dataset once (cached in benchmarks/work/, see dataset.py), reads it into the
page cache right before every run (untimed: this VM's kernel reclaims idle page cache within
tens of seconds, so a cache warmed once is partly cold by the next tool), or with --cold
evicts it before every run so each tool reads it from the disk, then runs every tool once
per round, interleaved (cat, tutorial, convert, variants,
then the next round), so load from other processes hits all tools alike. Each run is a whole
process, start-up included; output goes to benchmarks/work/out and is synced and deleted
between runs (not timed). Prints medians, and ratios taken within each round (then the
median of those), which are steadier than ratios of medians on a busy machine.

Columns: wall s, images/s, MB/s (input bytes / wall), peak RSS of the process tree,
CPU s (user + system time of the process tree), CPU % (CPU time / wall: 200% = two cores
busy), demand % ((CPU time + time waiting for a core) / wall: an estimate of the CPU % the
tool would reach alone on the machine, high for GIL-bound threads; measure.py), x cat (wall / cat's wall, lower is better),
speed-up vs the tutorial loop (tutorial's wall / wall, higher is better).

The `import-beam` row is a process that only imports apache_beam: the start-up floor of any
Beam job, against which the `x cat` goal can be judged.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset import WORK_DIR, dataset_bytes, generate  # noqa: E402
from measure import Measurement, aligned, run_measured  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def tool_commands(data: str, out: str, variants: dict[str, list[str]]) -> dict[str, list[str]]:
    """tool name -> command writing into `out` (a fresh folder per run)."""
    py = sys.executable
    convert = [py, "-m", "beam_pipeline", "convert", "--input", data]
    tools = {
        "cat": ["sh", "-c", f"find {shlex.quote(data)} -name '*.jpg' -print0 | xargs -0 cat > {out}/cat.bin"],
        "import-beam": [py, "-c", "import apache_beam"],
        "tutorial": [py, os.path.join(HERE, "tutorial_loop.py"), data, f"{out}/tutorial.tfrecord"],
        "tfds": [py, os.path.join(HERE, "tfds_builder.py"), data, f"{out}/tfds"],
        "convert": convert + ["--output_dir", f"{out}/convert"],
    }
    for name, flags in variants.items():
        tools[name] = convert + ["--output_dir", f"{out}/{name}"] + flags
    return tools


def compile_sources(repo: str = REPO) -> None:
    """Compiles the project's own modules (of the checkout at `repo`) to bytecode
    (`__pycache__`), as `pip install` does.

    An editable install (`make setup`) leaves them as source, and with
    PYTHONDONTWRITEBYTECODE=1 (as in this environment) every run would compile the
    ~40 modules again: ~0.06 s of CPU a start that no installed copy pays.
    """
    packages = [os.path.join(repo, name) for name in ("beam_pipeline", "transforms")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def drop_from_page_cache(root: str) -> int:
    """Evicts every file under `root` from the page cache (POSIX_FADV_DONTNEED; no root needed).

    Returns the number of files. The next read of each file then comes from the disk.
    """
    count = 0
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            count += 1
    return count


def read_all(root: str) -> None:
    """Reads every file under `root` (untimed), so that the next run finds them in memory."""
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def _load() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine skews wall times."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _fresh(out: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)


def _check(name: str, m: Measurement, log: str, out: str, count: int) -> None:
    if m.returncode != 0:
        sys.exit(f"{name} failed with status {m.returncode}; see {log}")
    summary = os.path.join(out, name, "summary.json")
    if os.path.exists(summary):
        with open(summary) as f:
            written = json.load(f)["written"]
        if written != count:
            sys.exit(f"{name} wrote {written} of {count} images; see {log}")


def format_table(rows: list[dict]) -> str:
    header = (
        "tool",
        "wall s",
        "images/s",
        "MB/s",
        "peak RSS MB",
        "CPU s",
        "CPU %",
        "demand %",
        "x cat",
        "speed-up vs tutorial",
    )
    lines = [header]
    for r in rows:
        lines.append(
            (
                r["tool"],
                f"{r['wall_s']:.2f}",
                f"{r['images_per_s']:.0f}",
                f"{r['mb_per_s']:.0f}",
                f"{r['peak_rss_mb']:.0f}",
                f"{r['cpu_s']:.1f}",
                f"{r['cpu_percent']:.0f}",
                f"{r['demand_percent']:.0f}",
                f"{r['x_cat']:.2f}" if r.get("x_cat") is not None else "-",
                f"{r['vs_tutorial']:.2f}" if r.get("vs_tutorial") is not None else "-",
            )
        )
    return aligned(lines)


def summarize(runs: dict[str, list[Measurement]], count: int, total_bytes: int) -> list[dict]:
    """One row per tool: medians, and the median of per-round ratios."""
    rounds = len(next(iter(runs.values())))
    rows = []
    for name, ms in runs.items():
        wall = statistics.median(m.wall_s for m in ms)
        row = {
            "tool": name,
            "wall_s": wall,
            "images_per_s": count / wall,
            "mb_per_s": total_bytes / 1e6 / wall,
            "peak_rss_mb": statistics.median(m.peak_rss_mb for m in ms),
            "cpu_s": statistics.median(m.cpu_s for m in ms),
            "cpu_percent": statistics.median(m.cpu_percent for m in ms),
            "demand_percent": statistics.median(m.demand_percent for m in ms),
            "walls": [round(m.wall_s, 3) for m in ms],
        }
        if "cat" in runs:
            row["x_cat"] = statistics.median(ms[i].wall_s / runs["cat"][i].wall_s for i in range(rounds))
        if "tutorial" in runs:
            row["vs_tutorial"] = statistics.median(
                runs["tutorial"][i].wall_s / ms[i].wall_s for i in range(rounds)
            )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16_000, help="JPEGs in the generated dataset.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tools", default="cat,import-beam,tutorial,convert", help="Comma-separated subset (also: tfds)."
    )
    parser.add_argument(
        "--cold", action="store_true", help="Evict the dataset from the page cache before every run."
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='NAME="FLAGS"',
        help="Also run convert with these extra flags (repeatable).",
    )
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--json", help="Also write the rows to this file.")
    args = parser.parse_args(argv)

    data = generate(args.count, work_dir=args.work_dir)
    count, total_bytes = dataset_bytes(data)
    out = os.path.join(args.work_dir, "out")
    logs = os.path.join(args.work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    variants = {}
    for spec in args.variant:
        name, _, flags = spec.partition("=")
        variants[name] = shlex.split(flags)
    wanted = args.tools.split(",") + list(variants)
    commands = {k: v for k, v in tool_commands(data, out, variants).items() if k in wanted}
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    compile_sources()

    print(f"dataset: {data}: {count} images, {total_bytes / 1e6:.0f} MB; {os.cpu_count()} cores", flush=True)
    print(f"load average before: {_load()}", flush=True)
    print(f"page cache: dataset {'evicted' if args.cold else 'read in'} before every run", flush=True)
    runs: dict[str, list[Measurement]] = {name: [] for name in commands}
    for r in range(args.rounds):
        for name, cmd in commands.items():
            _fresh(out)
            subprocess.run(["sync"], check=False)
            if args.cold:
                drop_from_page_cache(data)
            else:
                read_all(data)  # this VM's kernel reclaims idle page cache within seconds
            log = os.path.join(logs, f"{name}-{r}.log")
            m = run_measured(cmd, env=env, log_path=log)
            _check(name, m, log, out, count)
            runs[name].append(m)
            print(
                f"round {r + 1}/{args.rounds} {name}: {m.wall_s:.2f} s, CPU {m.cpu_s:.1f} s ({m.cpu_percent:.0f}%, demand {m.demand_percent:.0f}%), "
                f"peak RSS {m.peak_rss_mb:.0f} MB",
                flush=True,
            )
    shutil.rmtree(out, ignore_errors=True)
    rows = summarize(runs, count, total_bytes)
    print(f"load average after: {_load()}")
    print()
    cache = "cold page cache" if args.cold else "warm page cache"
    print(f"medians of {args.rounds} rounds, {count} images, {total_bytes / 1e6:.0f} MB, {cache}:")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "count": count,
                    "bytes": total_bytes,
                    "rounds": args.rounds,
                    "cold": args.cold,
                    "rows": rows,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
