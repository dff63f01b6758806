"""Where the CPU time of one conversion goes, per image and per stage.

    python benchmarks/stages.py [--count 16000]

Each stage of the hot path is timed over every image of the generated dataset, with the
project's real functions, streaming one image at a time through read, check, encode (with
the sha256 key) and write, as a writer does; list is the walk of the tree. Start-up is the CPU time of a process that
only imports the CLI, and the whole is the CPU time of a real single-threaded `convert`
(`--direct_running_mode=in_memory --direct_num_workers=1 --read_threads=1 --write_processes=1`); what the
stages do not explain is Beam's own per-element work (coders, bundles, side inputs).
For a flame graph of a default run: `py-spy record -o prof.svg -- python -m beam_pipeline convert ...`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from dataset import WORK_DIR, dataset_bytes, generate  # noqa: E402
from measure import run_measured  # noqa: E402


def stage_costs(data: str, out: str) -> dict[str, float]:
    """Seconds of each hot-path stage over every image under `data`, one image at a time.

    Images stream through the stages as in a writer (read, check, encode, write), so no
    stage works on hundreds of MB held in memory; each stage is timed per image with the
    monotonic clock (single thread: wall ~ CPU on an idle core).
    """
    from transforms.encoding.encoder import check_image
    from transforms.encoding.example import serialize_example_chunks
    from transforms.encoding.schema import SLIM
    from transforms.labels.folders import folder_label
    from transforms.listing.local import walk_local
    from transforms.records import ClassIndex, ImageRecord
    from transforms.writing.files import read_file
    from transforms.writing.shard import ShardFile

    clock = time.perf_counter_ns
    costs = dict.fromkeys(("list", "read", "check", "encode", "write"), 0)
    start = clock()
    files = list(walk_local(data))
    costs["list"] = clock() - start
    records = [ImageRecord(f.path, f.relpath, f.size, (folder_label(f.relpath, False)[1],)) for f in files]
    classes = ClassIndex(tuple(sorted({r.labels[0] for r in records})))
    os.makedirs(out, exist_ok=True)
    with ShardFile(os.path.join(out, "stages.tfrecord")) as shard:
        for r in records:
            t0 = clock()
            blob = read_file(r.path)
            t1 = clock()
            info = check_image(blob).info  # the writer's check
            t2 = clock()
            example = b"".join(serialize_example_chunks(SLIM.features(r, blob, info, classes), SLIM.kinds))
            t3 = clock()
            shard.write(example)
            t4 = clock()
            costs["read"] += t1 - t0
            costs["check"] += t2 - t1
            costs["encode"] += t3 - t2
            costs["write"] += t4 - t3
    return {k: v / 1e9 for k, v in costs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16_000)
    parser.add_argument("--work_dir", default=WORK_DIR)
    args = parser.parse_args(argv)
    data = generate(args.count, work_dir=args.work_dir)
    count, total_bytes = dataset_bytes(data)
    out = os.path.join(args.work_dir, "stages-out")
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": REPO}

    startup = run_measured([sys.executable, "-c", "import beam_pipeline.main"], env=env).cpu_s
    whole = run_measured(
        [
            *(
                sys.executable,
                "-m",
                "beam_pipeline",
                "convert",
                "--input",
                data,
                "--output_dir",
                out + "/convert",
            ),
            *(
                "--quiet",
                "--direct_running_mode=in_memory",
                "--direct_num_workers=1",
                "--read_threads=1",
                "--write_processes=1",
            ),
        ],
        env=env,
    )
    if whole.returncode:
        sys.exit(f"convert failed with status {whole.returncode}")
    rows = {"start-up (imports)": startup}
    rows.update(stage_costs(data, out))
    # Negative when the stages, timed apart on a busy or page-cache-starved machine, cost more
    # than inside the real run: then only the stage rows are meaningful.
    rows["Beam runtime and the rest"] = whole.cpu_s - sum(rows.values())
    shutil.rmtree(out, ignore_errors=True)

    print(f"{count} images, {total_bytes / 1e6:.0f} MB; single-threaded convert: {whole.cpu_s:.1f} s CPU")
    print(f"{'stage':28} {'CPU s':>7} {'per image us':>13} {'share':>6}")
    for stage, seconds in rows.items():
        print(f"{stage:28} {seconds:7.2f} {seconds / count * 1e6:13.0f} {seconds / whole.cpu_s:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
