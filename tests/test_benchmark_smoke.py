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


def test_peers_benchmark_reports_per_image_ratios(tmp_path):
    out = _bench(
        "peers.py",
        "--small",
        "10",
        "--large",
        "20",
        "--rounds",
        "1",
        "--tools",
        "cat,tfds",
        "--work_dir",
        str(tmp_path),
    )
    table = out[out.index("medians of 1 rounds, 10 and 20 images") :].splitlines()
    assert table[1].split()[:3] == ["tool", "10", "wall"]
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert set(rows) == {"cat", "tfds"}
    assert rows["tfds"][7:9] == ["1.00", "1.00"] and rows["cat"][10] == "1.00"
    assert float(rows["tfds"][-1]) > float(rows["cat"][-1])  # peak RSS: TFDS imports TensorFlow
    assert float(rows["tfds"][2]) > float(rows["cat"][2])  # a TFDS process costs more than cat


def test_tfds_builder_writes_every_image_readable_by_tfds(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from dataset import generate

    data = generate(12, work_dir=str(tmp_path))
    _bench("tfds_builder.py", data, str(tmp_path / "tfds"))
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(tmp_path / "tfds" / "bench_image_folder" / "1.0.0"))
    examples = list(builder.as_dataset(split="train"))
    assert len(examples) == 12
    assert builder.info.features["label"].names == [f"class_{c:02d}" for c in range(10)]
    from PIL import Image

    with Image.open(os.path.join(data, "class_03", "img_000003.jpg")) as image:
        expected_shape = (image.height, image.width, 3)
    shapes = [tuple(e["image"].shape) for e in examples if int(e["label"]) == 3]
    assert expected_shape in shapes


def test_tree_cpu_counts_forked_children_apart_from_the_runner():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from tree_cpu import profile

    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    code = (
        f"import os\npid = os.fork()\nif pid == 0:\n    exec({burn!r})\n    os._exit(0)\nos.waitpid(pid, 0)\n"
    )
    result = profile([sys.executable, "-c", code], interval=0.01)
    assert result["returncode"] == 0
    child = result["roles"]["child/main"]
    assert child["user"] + child["system"] >= 0.2  # the child's busy loop, not the parent's
    sampled = sum(r["user"] + r["system"] for r in result["roles"].values())
    assert sampled <= result["wait4_cpu_s"] + 0.05


def test_memory_benchmark_reports_each_process_and_where_the_runners_bytes_are(tmp_path):
    out = _bench(
        "memory.py", "--tiny", "--count", "30", "--rounds", "1", "--work_dir", str(tmp_path), "--where"
    )
    table = out[out.index("medians of 1 rounds") :].splitlines()
    assert table[1].split()[:4] == ["dataset", "images", "MB", "peak"]
    rows = {line.split()[0]: line.split() for line in table[2:4]}
    assert rows["1x"][1] == "30" and rows["4x"][1] == "120"
    runner, writer = float(rows["4x"][5]), float(rows["4x"][6])
    assert runner > 100 and 0 < writer < runner  # the runner imports Beam; a writer's own pages are fewer
    assert "peak RSS ratio 4x / 1x" in out
    assert out.count("runner buffers at the highest RSS") == 2  # runner_heap.py on both datasets


def test_coco_benchmark_reads_a_generated_file_and_prints_its_table(tmp_path):
    out = _bench("coco.py", "reader", "--images", "30", "--rounds", "1", "--work_dir", str(tmp_path))
    table = out[out.index("medians of 1 rounds") :].splitlines()
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert set(rows) == {"categories", "images", "annotations", "annotations+masks", "json.load"}
    assert rows["categories"][1] == "80" and rows["images"][1] == "30"
    assert rows["annotations"][1] == rows["json.load"][1] == f"{round(30 * 7.27)}"
    out = _bench("coco.py", "boxes", "--rows", "2000", "--rounds", "1", "--work_dir", str(tmp_path))
    assert out.splitlines()[-1].split()[:3] == ["read", "+", "BoxRows"] and "2,000" in out.splitlines()[-1]
