"""Smoke run of the benchmark on a tiny generated dataset: it runs and prints its table.

The speed and memory goals themselves are checked by running the scripts in full (see
benchmarks/README.md), never here.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def test_run_benchmark_prints_its_table(tmp_path):
    out = _bench(
        "run.py",
        "--count",
        "40",
        "--rounds",
        "1",
        "--work_dir",
        str(tmp_path),
        "--json",
        str(tmp_path / "r.json"),
        "--cold",
    )
    table = out[out.index("medians of 1 rounds, 40 images, 2 MB, cold page cache") :].splitlines()
    assert table[1].split()[:3] == ["tool", "wall", "s"]
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert set(rows) == {"cat", "import-beam", "tutorial", "convert"}
    assert rows["cat"][-2] == "1.00" and rows["tutorial"][-1] == "1.00"
    assert float(rows["convert"][1]) > 0

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from dataset import dataset_bytes, subset  # the 1x dataset of memory.py

    quarter = subset(10, 40, work_dir=str(tmp_path))
    assert dataset_bytes(quarter)[0] == 10
    assert os.path.samefile(
        os.path.join(quarter, "class_03", "img_000003.jpg"),
        tmp_path / "data-40-0" / "class_03" / "img_000003.jpg",
    )
