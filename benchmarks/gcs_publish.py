"""Publishing N shards on gs://, one by one (the loop publish used to run) vs in batches.

Against the local GCS emulator (tests/gcs_emulator.py): its requests take ~1-5 ms where real
GCS takes tens of ms, so the HTTP request count, printed next to the wall time, is the figure
that carries over to a real bucket. Each round stages N small shards plus the metadata files,
then publishes them over the previous round's dataset; the two ways alternate, round by round.

    python benchmarks/gcs_publish.py --shards 200 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
from apache_beam.io.filesystems import FileSystems

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.gcs_emulator import BUCKET, start_emulator  # noqa: E402
from transforms.output.publish import SUMMARY_FILE, is_dataset_file, list_children, publish  # noqa: E402
from transforms.writing.files import delete_paths

METADATA = ("failures.jsonl", "labels.txt", SUMMARY_FILE)


def one_by_one(output_dir: str, moves: list[tuple[str, str]]) -> None:
    """The publish loop before batching: a request or more per file, in turn."""
    finals = {name: staged for staged, name in moves}
    if FileSystems.exists(finals[SUMMARY_FILE]):
        delete_paths([FileSystems.join(output_dir, SUMMARY_FILE)])
    stale = [n for n in list_children(output_dir) if is_dataset_file(n) and n not in finals]
    delete_paths([FileSystems.join(output_dir, n) for n in stale])
    for staged, name in moves:
        final = FileSystems.join(output_dir, name)
        if FileSystems.exists(staged):
            delete_paths([final])
            FileSystems.rename([staged], [final])


def stage(bucket, shards: int, run: int) -> list[tuple[str, str]]:
    moves = []
    for i in range(shards):
        name = f"out/beam-temp-img2tfrecord-{run}/train/{i:05d}.tfrecord"
        bucket.blob(name).upload_from_string(b"x" * 1024)
        moves.append((f"gs://{BUCKET}/{name}", f"train-{i:05d}-of-{shards:05d}.tfrecord"))
    for meta in METADATA:
        name = f"out/beam-temp-img2tfrecord-{run}/metadata/{meta}"
        bucket.blob(name).upload_from_string(b"{}")
        moves.append((f"gs://{BUCKET}/{name}", meta))
    return moves


class RequestCount:
    """Counts the HTTP requests this process sends (a GCS batch request counts once)."""

    def __init__(self):
        self.count = 0
        self._send = requests.Session.send

    def __enter__(self):
        counter = self

        def send(session, request, **kwargs):
            counter.count += 1
            return counter._send(session, request, **kwargs)

        requests.Session.send = send
        return self

    def __exit__(self, *exc):
        requests.Session.send = self._send


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    emulator = start_emulator(Path(tempfile.mkdtemp()), [BUCKET])
    os.environ.update(emulator.env)
    from google.cloud import storage

    bucket = storage.Client().bucket(BUCKET)
    results: dict[str, list[tuple[float, int]]] = {"one by one": [], "batched": []}
    try:
        run = 0
        for _ in range(args.rounds):
            for way, fn in (("one by one", one_by_one), ("batched", publish)):
                run += 1
                moves = stage(bucket, args.shards, run)
                with RequestCount() as requests_sent:
                    start = time.perf_counter()
                    fn(f"gs://{BUCKET}/out", moves)
                    results[way].append((time.perf_counter() - start, requests_sent.count))
    finally:
        emulator.stop()
    print(
        f"load average {os.getloadavg()[0]:.2f}; {args.shards} shards + {len(METADATA)} metadata files, GCS emulator"
    )
    print(f"{'way':<12} {'median s':>9} {'requests':>9}  rounds (s)")
    for way, runs in results.items():
        times = [t for t, _ in runs]
        print(
            f"{way:<12} {statistics.median(times):>9.2f} {statistics.median(n for _, n in runs):>9.0f}  "
            + " ".join(f"{t:.2f}" for t in times)
        )


if __name__ == "__main__":
    main()
