"""Fencing: a run that lost its claim changes nothing in the folder and stops with exit 2.

A run loses its claim when it stalls past its lease (a paused VM, a suspended laptop: here
SIGSTOP) or its launcher dies while something of it still runs, and another run takes the
folder over. Locally the lost run is simulated by dropping its lock (as its death would);
on gs:// by a stalled real CLI run on the GCS emulator (tests/gcs_emulator.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from tests.gcs_emulator import BUCKET, download_prefix, upload_tree
from transforms.output.claim import claim_output
from transforms.output.fence import HEARTBEAT_KEY, ClaimLost, Fence
from transforms.output.publish import MARKER_FILE, publish
from transforms.testhooks import LEASE_ENV, PAUSE_ENV

ROOT = Path(__file__).resolve().parents[2]


def _staged(tmp_path: Path, tag: str) -> list[tuple[str, str]]:
    staging = tmp_path / f"staging-{tag}"
    staging.mkdir()
    names = ["train-00000-of-00001.tfrecord", "failures.jsonl", "labels.txt", "summary.json"]
    for name in names:
        (staging / name).write_text(f"{tag} {name}")
    return [(str(staging / n), n) for n in names]


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_a_local_run_that_lost_its_claim_changes_nothing(tmp_path):
    out = tmp_path / "out"
    old = claim_output(str(out), False, "old")
    old_fence = Fence.of(old)
    old._close()  # the old run's process is gone (its lock dropped), its job steps are not
    new = claim_output(str(out), False, "new")
    try:
        assert new.resumed == "old"
        publish(str(out), _staged(tmp_path, "new"), keep_marker=True, fence=Fence.of(new))  # half-way
        before = _snapshot(out)
        with pytest.raises(ClaimLost, match="another run took over --output_dir"):
            publish(str(out), _staged(tmp_path, "old"), fence=old_fence)
        old_fence.remove_marker()  # not its marker any more: kept
        assert _snapshot(out) == before
        assert json.loads((out / MARKER_FILE).read_text())["run_id"] == "new"
    finally:
        new.release()


def test_a_gcs_run_that_lost_its_claim_changes_nothing(gcs_bucket, tmp_path):
    out = f"gs://{BUCKET}/fenced"
    old = claim_output(out, False, "old")
    old_fence = Fence.of(old)
    old._close()  # its heartbeat stops (a stalled process)
    marker = gcs_bucket.blob(f"fenced/{MARKER_FILE}")
    marker.reload()
    marker.metadata = {HEARTBEAT_KEY: repr(time.time() - 3600)}  # its lease ran out
    marker.patch()
    new = claim_output(out, False, "new")
    try:
        assert new.resumed == "old"
        gcs_bucket.blob("fenced/summary.json").upload_from_string(b"new")
        names = sorted(b.name for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="fenced/"))
        with pytest.raises(ClaimLost, match="another run took over --output_dir"):
            publish(out, _staged(tmp_path, "old"), fence=old_fence)
        old_fence.remove_marker()  # deleted only at its own generation: kept
        assert sorted(b.name for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="fenced/")) == names
        assert gcs_bucket.blob("fenced/summary.json").download_as_bytes() == b"new"
        assert json.loads(gcs_bucket.blob(f"fenced/{MARKER_FILE}").download_as_bytes())["run_id"] == "new"
    finally:
        new.release()


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_for_flag(flag: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not flag.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"never reached {flag.name}"
        time.sleep(0.05)


def _objects(bucket, prefix: str) -> dict[str, tuple[int, str]]:
    return {b.name: (b.generation, b.md5_hash) for b in bucket.client.list_blobs(bucket, prefix=prefix + "/")}


def test_a_stalled_gcs_run_resumed_after_a_takeover_fails_and_changes_nothing(gcs_bucket, tmp_path):
    images = tmp_path / "images"
    for i in range(6):
        write_image(images / ("cat", "dog")[i % 2] / f"{i}.png", (10 + i, 12), seed=i)
    upload_tree(gcs_bucket, images, "stall-in")
    args = ["--input", f"gs://{BUCKET}/stall-in", "--num_shards", "2", "--quiet"]
    assert main.main([*args, "--output_dir", f"gs://{BUCKET}/stall-ref"]) == main.EXIT_OK
    out = f"gs://{BUCKET}/stall-out"
    lease = {LEASE_ENV: "3"}
    # A: stopped (SIGSTOP: every thread, its heartbeat too) in the middle of publishing.
    flag_a, flag_b = tmp_path / "a-paused", tmp_path / "b-paused"
    a = _start([*args, "--output_dir", out], {**lease, PAUSE_ENV: f"publish:{flag_a}"})
    _wait_for_flag(flag_a, a)
    os.killpg(a.pid, signal.SIGSTOP)
    time.sleep(5)  # past A's lease
    # B takes the folder over (A's lease ran out) and is half-way through its own run.
    b = _start([*args, "--output_dir", out], {**lease, PAUSE_ENV: f"write_shard:{flag_b}"})
    try:
        _wait_for_flag(flag_b, b)
        before = _objects(gcs_bucket, "stall-out")
        assert json.loads(gcs_bucket.blob(f"stall-out/{MARKER_FILE}").download_as_bytes())["run_id"]
        flag_a.unlink()
        os.killpg(a.pid, signal.SIGCONT)  # A resumes where it stopped
        _, err = a.communicate(timeout=120)
        lines = err.decode().strip().splitlines()
        assert a.returncode == main.EXIT_USAGE, err.decode()[-3000:]
        assert len(lines) == 1 and "another run took over --output_dir " + out in lines[0], lines
        assert _objects(gcs_bucket, "stall-out") == before  # nothing of B's changed
        flag_b.unlink()
        _, err = b.communicate(timeout=300)
        assert b.returncode == 0, err.decode()[-3000:]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    ref, got = tmp_path / "ref", tmp_path / "got"
    names = download_prefix(gcs_bucket, "stall-ref", ref)
    assert download_prefix(gcs_bucket, "stall-out", got) == names
    assert {n: (got / n).read_bytes() for n in names} == {n: (ref / n).read_bytes() for n in names}
