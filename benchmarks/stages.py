"""Where the CPU time of one conversion goes, per image and per stage.

    python benchmarks/stages.py [--count 16000]

Each stage of the hot path is timed on its own over every image of the generated dataset,
with the project's real functions and CPU time (`time.process_time`, steady on a busy
machine): list, read, check, encode, write. Start-up is the CPU time of a process that
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


def _cpu(fn) -> tuple[float, object]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def stage_costs(data: str, out: str) -> dict[str, float]:
    """CPU seconds of each hot-path stage over every image under `data`."""
    from apache_beam.io.filesystems import FileSystems

    from transforms.encode import check_image
    from transforms.example import serialize_example
    from transforms.labels import ClassIndex, folder_label
    from transforms.listing import has_image_extension, to_image_file
    from transforms.records import ImageRecord
    from transforms.schema import SLIM
    from transforms.shard_writer import ShardFile
    from transforms.write import read_file

    costs = {}
    costs["list"], files = _cpu(
        lambda: [
            to_image_file(m, data)
            for m in FileSystems.match([data + "/**"])[0].metadata_list
            if has_image_extension(m.path)
        ]
    )
    records = [ImageRecord(f.path, f.relpath, f.size, (folder_label(f.relpath, False)[1],)) for f in files]
    classes = ClassIndex(tuple(sorted({r.labels[0] for r in records})))
    costs["read"], blobs = _cpu(lambda: [read_file(r.path) for r in records])
    costs["check"], prepared = _cpu(lambda: [check_image(b) for b in blobs])  # the writer's check
    infos = [p.info for p in prepared]
    costs["encode"], examples = _cpu(
        lambda: [
            serialize_example(SLIM.build(r, b, i, classes), SLIM.kinds)
            for r, b, i in zip(records, blobs, infos)
        ]
    )
    os.makedirs(out, exist_ok=True)

    def write() -> None:
        with ShardFile(os.path.join(out, "stages.tfrecord")) as shard:
            for e in examples:
                shard.write(e)

    costs["write"], _ = _cpu(write)
    return costs


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
    rows["Beam runtime and the rest"] = max(0.0, whole.cpu_s - sum(rows.values()))
    shutil.rmtree(out, ignore_errors=True)

    print(f"{count} images, {total_bytes / 1e6:.0f} MB; single-threaded convert: {whole.cpu_s:.1f} s CPU")
    print(f"{'stage':28} {'CPU s':>7} {'per image us':>13} {'share':>6}")
    for stage, seconds in rows.items():
        print(f"{stage:28} {seconds:7.2f} {seconds / count * 1e6:13.0f} {seconds / whole.cpu_s:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
