"""img2tfrecord against its peers at two sizes: whole-run and per-image (marginal) cost.

    python benchmarks/peers.py                       # 8,000 and 16,000 JPEGs, 3 rounds
    python benchmarks/peers.py --rounds 5 --tools cat,tfds,convert --variant one=--write_processes=1
    python benchmarks/peers.py --tools cat,convert --baseline /tmp/main-checkout   # A/B of two trees

The peers, each a whole process on the same class folders (issue 19): `cat` (the floor of
copying the bytes), the TensorFlow tutorial loop (`tutorial_loop.py`), a TFDS
`GeneratorBasedBuilder` (`tfds_builder.py`) and `img2tfrecord convert` (default flags, plus
any `--variant`; with `--baseline DIR`, also `before`: the same convert run from the
checkout at DIR, on PYTHONPATH, with this tree's environment). The small dataset is the first `--small` images of the large one, as hard
links (`dataset.subset`), so both sizes read the same kind of files and a warm page cache
for the large one also covers the small one.

Every round runs every tool at both sizes back to back (tool by tool, the two sizes
adjacent, the order of the sizes alternating between rounds), reading the dataset into the
page cache right before each run (untimed; this VM's kernel reclaims idle page cache within
tens of seconds), or with --cold evicting it, so that every tool reads from the disk (which
costs the reading process ~140 us of kernel CPU an image more: benchmarks/README.md). The per-image (marginal) cost of a tool is (large - small) / (images
added), taken within each round, for wall and for CPU (user + system of the whole process
tree, the forked writers included: measure.py); start-up and other fixed costs cancel out.
Printed figures are medians over the rounds, and each ratio is the median of the ratios
taken within the rounds:

- `per image vs tfds`: TFDS's marginal wall (CPU) / the tool's (higher is better; goal >= 3);
- `run vs tutorial`: the tutorial's whole-run wall at the large size / the tool's (goal >= 6);
- `marginal x cat`: the tool's marginal wall / cat's (lower is better; goal <= 2.5).

Peak RSS (of the process tree, measure.py) at both sizes closes each row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset import WORK_DIR, dataset_bytes, generate, subset  # noqa: E402
from measure import Measurement, aligned, run_measured  # noqa: E402
from run import REPO, _fresh, _load, compile_sources, drop_from_page_cache, read_all, tool_commands  # noqa: E402

_WROTE = re.compile(rb"wrote (\d+) images")


def _written(name: str, out: str, log: str) -> int | None:
    """Images the run says it wrote (summary.json for convert, its last log line for the peers)."""
    summary = os.path.join(out, name, "summary.json")
    if os.path.exists(summary):
        with open(summary) as f:
            return json.load(f)["written"]
    with open(log, "rb") as f:
        found = _WROTE.findall(f.read())
    return int(found[-1]) if found else None


def _check(name: str, m: Measurement, log: str, out: str, count: int) -> None:
    if m.returncode != 0:
        sys.exit(f"{name} failed with status {m.returncode}; see {log}")
    written = _written(name, out, log)
    if written is not None and written != count:
        sys.exit(f"{name} wrote {written} of {count} images; see {log}")


def summarize(runs: dict[str, dict[int, list[Measurement]]], small: int, large: int) -> list[dict]:
    """One row per tool: median whole-run figures at both sizes, marginals and ratios."""
    added = large - small
    rounds = len(next(iter(runs.values()))[large])

    def marginal(name: str, i: int, field: str) -> float:
        """Microseconds per added image in round i."""
        return 1e6 * (getattr(runs[name][large][i], field) - getattr(runs[name][small][i], field)) / added

    rows = []
    for name, by_size in runs.items():
        row = {"tool": name}
        for size in (small, large):
            row[f"wall_s_{size}"] = statistics.median(m.wall_s for m in by_size[size])
            row[f"cpu_s_{size}"] = statistics.median(m.cpu_s for m in by_size[size])
            row[f"walls_{size}"] = [round(m.wall_s, 3) for m in by_size[size]]
            row[f"cpus_{size}"] = [round(m.cpu_s, 3) for m in by_size[size]]
            row[f"peak_rss_mb_{size}"] = statistics.median(m.peak_rss_mb for m in by_size[size])
        row["wall_us"] = statistics.median(marginal(name, i, "wall_s") for i in range(rounds))
        row["cpu_us"] = statistics.median(marginal(name, i, "cpu_s") for i in range(rounds))
        if "tfds" in runs:
            row["vs_tfds_wall"] = statistics.median(
                marginal("tfds", i, "wall_s") / marginal(name, i, "wall_s") for i in range(rounds)
            )
            row["vs_tfds_cpu"] = statistics.median(
                marginal("tfds", i, "cpu_s") / marginal(name, i, "cpu_s") for i in range(rounds)
            )
        if "tutorial" in runs:
            row["vs_tutorial"] = statistics.median(
                runs["tutorial"][large][i].wall_s / by_size[large][i].wall_s for i in range(rounds)
            )
        if "cat" in runs:
            row["x_cat"] = statistics.median(
                marginal(name, i, "wall_s") / marginal("cat", i, "wall_s") for i in range(rounds)
            )
        rows.append(row)
    return rows


def _size_label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def format_table(rows: list[dict], small: int, large: int) -> str:
    k, m = _size_label(small), _size_label(large)

    def ratio(r: dict, key: str) -> str:
        return f"{r[key]:.2f}" if key in r else "-"

    header = (
        "tool",
        f"{k} wall s",
        f"{m} wall s",
        f"{k} CPU s",
        f"{m} CPU s",
        "us/image wall",
        "us/image CPU",
        "per image vs tfds (wall)",
        "(CPU)",
        f"run vs tutorial at {m}",
        "marginal x cat",
        f"{k} RSS MB",
        f"{m} RSS MB",
    )
    lines = [header]
    for r in rows:
        lines.append(
            (
                r["tool"],
                f"{r[f'wall_s_{small}']:.2f}",
                f"{r[f'wall_s_{large}']:.2f}",
                f"{r[f'cpu_s_{small}']:.2f}",
                f"{r[f'cpu_s_{large}']:.2f}",
                f"{r['wall_us']:.0f}",
                f"{r['cpu_us']:.0f}",
                ratio(r, "vs_tfds_wall"),
                ratio(r, "vs_tfds_cpu"),
                ratio(r, "vs_tutorial"),
                ratio(r, "x_cat"),
                f"{r[f'peak_rss_mb_{small}']:.0f}",
                f"{r[f'peak_rss_mb_{large}']:.0f}",
            )
        )
    return aligned(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=8_000, help="Images in the small dataset.")
    parser.add_argument("--large", type=int, default=16_000, help="Images in the large dataset.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", default="cat,tutorial,tfds,convert", help="Comma-separated subset.")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='NAME="FLAGS"',
        help="Also run convert with these extra flags (repeatable).",
    )
    parser.add_argument(
        "--cold", action="store_true", help="Evict the dataset from the page cache before every run."
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="Also run convert (as `before`) from the checkout at DIR: before/after in the same rounds.",
    )
    parser.add_argument("--work_dir", default=WORK_DIR)
    parser.add_argument("--json", help="Also write the rows to this file.")
    args = parser.parse_args(argv)
    if not 0 < args.small < args.large:
        parser.error("--small must be positive and below --large")

    data = {args.large: generate(args.large, work_dir=args.work_dir)}
    data[args.small] = subset(args.small, args.large, work_dir=args.work_dir)
    sizes = {size: dataset_bytes(root) for size, root in data.items()}
    out = os.path.join(args.work_dir, "out")
    logs = os.path.join(args.work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    variants = {name: shlex.split(flags) for name, _, flags in (v.partition("=") for v in args.variant)}
    wanted = args.tools.split(",") + list(variants)
    commands = {
        size: {k: v for k, v in tool_commands(root, out, variants).items() if k in wanted}
        for size, root in data.items()
    }
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    compile_sources()
    if args.baseline:
        baseline = os.path.abspath(args.baseline)
        compile_sources(baseline)
        for size, tools in commands.items():
            convert = tool_commands(os.path.abspath(data[size]), os.path.abspath(out), {})["convert"]
            # From DIR: `python -m` puts the working folder first on sys.path.
            tools["before"] = ["env", f"--chdir={baseline}", f"PYTHONPATH={baseline}", *convert[:-1]]
            tools["before"].append(os.path.join(os.path.abspath(out), "before"))

    for size in (args.small, args.large):
        print(f"dataset: {data[size]}: {sizes[size][0]} images, {sizes[size][1] / 1e6:.0f} MB", flush=True)
    print(f"{os.cpu_count()} cores; load average before: {_load()}", flush=True)
    names = list(commands[args.large])
    runs: dict[str, dict[int, list[Measurement]]] = {n: {args.small: [], args.large: []} for n in names}
    for r in range(args.rounds):
        order = (args.small, args.large) if r % 2 == 0 else (args.large, args.small)
        for name in names:
            for size in order:
                _fresh(out)
                subprocess.run(["sync"], check=False)
                if args.cold:
                    drop_from_page_cache(data[size])
                else:
                    read_all(data[size])  # this VM's kernel reclaims idle page cache within seconds
                log = os.path.join(logs, f"peers-{name}-{size}-{r}.log")
                m = run_measured(commands[size][name], env=env, log_path=log)
                _check(name, m, log, out, sizes[size][0])
                runs[name][size].append(m)
                print(
                    f"round {r + 1}/{args.rounds} {name} {size}: {m.wall_s:.2f} s, CPU {m.cpu_s:.2f} s, "
                    f"peak RSS {m.peak_rss_mb:.0f} MB; load {_load()}",
                    flush=True,
                )
    shutil.rmtree(out, ignore_errors=True)
    rows = summarize(runs, args.small, args.large)
    print(f"load average after: {_load()}")
    print()
    cache = "cold" if args.cold else "warm"
    print(f"medians of {args.rounds} rounds, {args.small} and {args.large} images, {cache} page cache:")
    print(format_table(rows, args.small, args.large))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"small": args.small, "large": args.large, "rounds": args.rounds, "rows": rows}, f, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
