"""The job graph with GLDv2's class count: a 203,094-class id,name --label_map (~70-character URL
names) and a labels table. Per round, in a fresh process: seconds to build the graph
(build_pipeline) and to serialize it, and the serialized size (`p.to_runner_api()`, what a
runner is sent). With `--against DIR` the same runs alternate with the checkout in DIR
(e.g. a worktree of main): interleaved rounds, medians and the ratio.

    .venv/bin/python benchmarks/graph_size.py --rounds 3 --against /path/to/main/worktree
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parent / "work" / "graph_size"
CLASSES = 203_094

_ONE_BUILD = """
import json, sys, time
t0 = time.perf_counter()
import apache_beam as beam
from beam_pipeline import main
from beam_pipeline.cli.options import ConvertOptions, route_labels_flag
from beam_pipeline.pipeline import build_pipeline
t1 = time.perf_counter()
options = main.RunOptions(route_labels_flag(sys.argv[1:]))
p = beam.Pipeline(options=options)
build_pipeline(p, options.view_as(ConvertOptions), "0" * 32)
t2 = time.perf_counter()
size = len(p.to_runner_api().SerializeToString())
t3 = time.perf_counter()
print(json.dumps({"build_s": t2 - t1, "serialize_s": t3 - t2, "mb": size / 1e6}))
"""


def _inputs() -> list[str]:
    """The map, a 3-row table and 3 images (only the graph is built), made once."""
    label_map = WORK / "train_label_to_category.csv"
    if not label_map.exists():
        from PIL import Image

        (WORK / "in").mkdir(parents=True, exist_ok=True)
        for i in range(3):
            Image.new("RGB", (4, 4), (i, 0, 0)).save(WORK / "in" / f"{i}.png")
        (WORK / "train.csv").write_text("id,landmark_id\n0,1\n1,2\n2,3\n")
        rnd, letters = random.Random(0), string.ascii_letters + "_()0123456789"
        names = ("".join(rnd.choice(letters) for _ in range(27)) for _ in range(CLASSES))
        text = "".join(f"{i},http://commons.wikimedia.org/wiki/Category:{n}\n" for i, n in enumerate(names))
        label_map.write_text("landmark_id,category\n" + text)
    return ["--input", str(WORK / "in"), "--output_dir", str(WORK / "out"), "--labels", str(WORK / "train.csv")] + [
        "--key_column", "id", "--label_column", "landmark_id", "--label_map", str(label_map)
    ]  # fmt: skip


def _one(checkout: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", _ONE_BUILD, *args], cwd=checkout, env=env, capture_output=True
    )
    if done.returncode:
        raise SystemExit(done.stderr.decode()[-2000:])
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run alternately")
    flags = parser.parse_args()
    args = _inputs()
    checkouts = {"this": Path(__file__).resolve().parents[1]}
    if flags.against:
        checkouts["against"] = flags.against.resolve()
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for _ in range(flags.rounds):
        for name, checkout in checkouts.items():
            runs[name].append(_one(checkout, args))
            print(name, json.dumps({k: round(v, 2) for k, v in runs[name][-1].items()}), flush=True)
    medians = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    for name, m in medians.items():
        print(
            f"{name}: build {m['build_s']:.2f} s, serialize {m['serialize_s']:.2f} s, {m['mb']:.2f} MB (medians)"
        )
    if flags.against:
        ratio = {k: medians["this"][k] / medians["against"][k] for k in ("build_s", "serialize_s", "mb")}
        print("this / against:", json.dumps({k: round(v, 3) for k, v in ratio.items()}))
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
