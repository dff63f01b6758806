"""Claiming the output folder: one live run at a time, dead runs taken over, nothing left behind.

Runs that hold a claim are real processes (`claim_output` in a subprocess, or the CLI);
a dead run is a marker nobody holds, as SIGKILL leaves it. The full disk is a real one
(a tiny tmpfs, mounted where the tests run as root) and gs:// is the local GCS emulator,
which checks `ifGenerationMatch` like GCS (tests/gcs_emulator.py).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from google.cloud.storage import Blob

from beam_pipeline import main
from tests.conftest import METADATA_FILES, write_image
from tests.gcs_emulator import BUCKET
from transforms.output.claim import PROBE_PREFIX, NotWritable, claim_output
from transforms.output.fence import HEARTBEAT_KEY, LEASE_SECONDS
from transforms.output.publish import MARKER_FILE, OutputBusy
from transforms.testhooks import LEASE_ENV

ROOT = Path(__file__).resolve().parents[2]

# A process that claims each folder named on its stdin at the instant given with it (a
# CLOCK_MONOTONIC time, shared by every process of the machine), answers 'won' or 'busy',
# and holds every claim it won until its stdin closes.
_CLAIMER = """
import sys, time
from transforms.output.publish import OutputBusy
from transforms.output.claim import claim_output
held = []
for line in sys.stdin:
    folder, run_id, start = line.rstrip("\\n").split("\\t")
    while time.monotonic_ns() < int(start):
        pass
    try:
        held.append(claim_output(folder, False, run_id))
        print("won", flush=True)
    except OutputBusy:
        print("busy", flush=True)
"""


def _claimer() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CLAIMER], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _answer(proc: subprocess.Popen) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready, "a claimer did not answer within 60 s"
    return proc.stdout.readline().strip()


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        proc.wait(timeout=30)
        proc.stdout.close()


def _argv(tmp_path: Path, out, *extra: str) -> list[str]:
    write_image(tmp_path / "imgs" / "c" / "x.png")
    return ["--input", str(tmp_path / "imgs"), "--output_dir", str(out), "--quiet", *extra]


def _dead_marker(out: Path, **fields) -> None:
    """The marker a SIGKILLed run leaves: complete, but no process holds its lock."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_FILE).write_text(json.dumps({"run_id": "dead", "host": socket.gethostname(), **fields}))


# --- two runs started together ---------------------------------------------------------------


def _claim_at(proc: subprocess.Popen, folder: Path, run_id: str, start: int = 0) -> None:
    proc.stdin.write(f"{folder}\t{run_id}\t{start}\n")
    proc.stdin.flush()


def test_runs_started_together_claim_a_folder_once(tmp_path):
    """Two processes (one per core) claim the same fresh folder at the same instant, 40 times over."""
    procs = [_claimer() for _ in range(2)]
    try:
        for round_ in range(40):
            folder = tmp_path / f"out{round_}"
            start = time.monotonic_ns() + 20_000_000  # both spin until then, then claim
            for i, proc in enumerate(procs):
                _claim_at(proc, folder, f"r{round_}-{i}", start)
            answers = [_answer(proc) for proc in procs]
            assert answers.count("won") == 1, f"round {round_}: {answers}"
            winner = f"r{round_}-{answers.index('won')}"
            assert json.loads((folder / MARKER_FILE).read_text())["run_id"] == winner
            assert sorted(os.listdir(folder)) == [MARKER_FILE]
    finally:
        _stop(procs)


def test_a_live_cli_run_is_refused_even_with_overwrite_and_its_marker_left_alone(tmp_path, capsys):
    out = tmp_path / "o"
    holder = _claimer()
    try:
        _claim_at(holder, out, "live-run")
        assert _answer(holder) == "won"
        marker = (out / MARKER_FILE).read_bytes()
        assert main.main(_argv(tmp_path, out, "--overwrite")) == main.EXIT_USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "being written by another img2tfrecord run (run live-run, pid" in err[0], err
        assert (out / MARKER_FILE).read_bytes() == marker and sorted(os.listdir(out)) == [MARKER_FILE]
    finally:
        _stop([holder])
    # Its process gone (the lock with it), the same command takes the folder over.
    assert main.main(_argv(tmp_path, out, "--overwrite")) == main.EXIT_OK
    assert sorted(os.listdir(out)) == sorted(METADATA_FILES + ["train-00000-of-00001.tfrecord"])


# --- a dead run's marker, whatever its pid now names -----------------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_dead_runs_marker_is_taken_over_though_its_pid_is_alive(tmp_path, overwrite):
    """A restarted container: the dead run's pid now belongs to another live process (here
    a sleeper on this host), which must not keep the folder blocked."""
    out = tmp_path / "o"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _dead_marker(out, pid=sleeper.pid)
        (out / "failures.jsonl").write_text("left by the dead run\n")
        extra = ["--overwrite"] if overwrite else []
        summary = main.run(_argv(tmp_path, out, *extra), save_main_session=False)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert summary["written"] == 1
    assert sorted(os.listdir(out)) == sorted(METADATA_FILES + ["train-00000-of-00001.tfrecord"])


def test_claim_reports_the_dead_run_it_replaces(tmp_path):
    out = tmp_path / "o"
    _dead_marker(out, pid=os.getpid())  # even our own pid: only the lock counts
    claim = claim_output(str(out), False, "new")
    try:
        assert claim.resumed == "dead"
        assert json.loads((out / MARKER_FILE).read_text())["run_id"] == "new"
    finally:
        claim.release()
    (out / MARKER_FILE).write_bytes(b"")  # a marker cut short by a kill while it was written
    claim = claim_output(str(out), False, "newer")
    try:
        assert claim.resumed == "unknown"
    finally:
        claim.release()


# --- leftovers of a run killed at any instant ---------------------------------------------------


@pytest.mark.parametrize("marker", ["complete", "empty", "none"])
def test_a_rerun_cleans_probe_and_staging_leftovers(tmp_path, marker):
    out = tmp_path / "o"
    out.mkdir()
    if marker == "complete":
        _dead_marker(out, pid=2**22 + 7)
    elif marker == "empty":
        (out / MARKER_FILE).write_bytes(b"")
    probe = out / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    probe.write_bytes(b"")  # killed between creating and deleting its writability probe
    (out / "beam-temp-img2tfrecord-dead" / "train").mkdir(parents=True)
    (out / "beam-temp-img2tfrecord-dead" / "train" / "00000.tfrecord").write_bytes(b"partial")
    main.run(_argv(tmp_path, out), save_main_session=False)
    assert sorted(os.listdir(out)) == sorted(METADATA_FILES + ["train-00000-of-00001.tfrecord"])


# --- a full filesystem ------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs with free inodes and no free bytes (skipped where mount is not allowed)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=64", "tmpfs", str(mnt)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (mnt / "out").mkdir()
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_one_line_exit_2_and_leaves_nothing(tmp_path, full_disk, capsys):
    (full_disk / "out" / "empty-but-possible").touch()  # free inodes indeed
    (full_disk / "out" / "empty-but-possible").unlink()
    out = full_disk / "out"
    assert main.main(_argv(tmp_path, out)) == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not writable: No space left on device" in err[0], err
    assert os.listdir(out) == []
    with pytest.raises(NotWritable):  # the same through the library call
        claim_output(str(out / "sub"), False, "r")
    assert os.listdir(out / "sub") == []


# --- gs:// ---------------------------------------------------------------------------------------


def _gcs_marker(gcs_bucket, prefix: str, age: float) -> None:
    blob = gcs_bucket.blob(f"{prefix}/{MARKER_FILE}")
    blob.metadata = {HEARTBEAT_KEY: repr(time.time() - age)}
    blob.upload_from_string(json.dumps({"run_id": "other", "pid": 1, "host": "elsewhere"}).encode())


def test_gcs_claims_are_exclusive_and_a_stale_lease_is_taken_over(gcs_bucket):
    out = f"gs://{BUCKET}/claims/together"
    results: list = [None] * 4
    start = threading.Barrier(4)

    def claim(i: int) -> None:
        start.wait()
        try:
            results[i] = claim_output(out, False, f"r{i}")
        except OutputBusy as e:
            results[i] = e

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if not isinstance(r, OutputBusy)]
    try:
        assert len(won) == 1, results
        stored = json.loads(gcs_bucket.blob(f"claims/together/{MARKER_FILE}").download_as_bytes())
        assert stored["run_id"] == won[0].run_id
    finally:
        for claim_ in won:
            claim_.release()

    _gcs_marker(gcs_bucket, "claims/live", age=5)
    with pytest.raises(OutputBusy, match="being written by another img2tfrecord run \\(run other"):
        claim_output(f"gs://{BUCKET}/claims/live", True, "mine")

    _gcs_marker(gcs_bucket, "claims/dead", age=LEASE_SECONDS + 5)
    gcs_bucket.blob(f"claims/dead/{PROBE_PREFIX}0123").upload_from_string(b"")
    gcs_bucket.blob("claims/dead/beam-temp-img2tfrecord-other/x").upload_from_string(b"partial")
    taken = claim_output(f"gs://{BUCKET}/claims/dead", False, "mine")
    try:
        assert taken.resumed == "other"
        names = [b.name for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="claims/dead/")]
        assert names == [f"claims/dead/{MARKER_FILE}"]
        assert (
            json.loads(gcs_bucket.blob(f"claims/dead/{MARKER_FILE}").download_as_bytes())["run_id"] == "mine"
        )
    finally:
        taken.abandon()
    assert (
        taken.resumed and gcs_bucket.blob(f"claims/dead/{MARKER_FILE}").exists()
    )  # the dead run's leftovers stay marked


class _HeldBeats:
    """Steps a RemoteClaim's heartbeat thread from the test, with events instead of sleeps.

    Every beat's `Blob.patch` goes through `patch`, which records each landed beat. Once
    `hold` is set, the next beat waits in flight (before its request) until the claim's
    stop event is set and the release has either returned or is waiting for the heartbeat
    thread (its `join`); only then does it land. A release that does not wait for the
    thread therefore returns before the beat lands, whatever the machine's load.
    """

    WAIT = 60  # seconds: a bound on a broken product, never reached by a working one

    def __init__(self, claim, monkeypatch):
        self.alive, self.log = claim._alive, []
        self.landed, self.hold, self.in_flight, self.releasing = (threading.Event() for _ in range(4))
        self._patch, self._join = Blob.patch, self.alive._thread.join
        beats = self

        def patch(blob, **kwargs):
            if beats.hold.is_set():
                beats.in_flight.set()
                assert beats.alive._stop.wait(beats.WAIT) and beats.releasing.wait(beats.WAIT)
            beats._patch(blob, **kwargs)
            beats.log.append(("landed", blob.metadata[HEARTBEAT_KEY]))
            beats.landed.set()

        monkeypatch.setattr(Blob, "patch", patch)
        self.alive._thread.join = self.join

    def join(self, timeout=None):
        self.releasing.set()  # release is waiting for the heartbeat thread: let the beat land
        self._join(timeout)


def test_a_gcs_claim_keeps_its_lease_alive_until_released(gcs_bucket, monkeypatch):
    monkeypatch.setenv(LEASE_ENV, "1.2")  # a heartbeat every 0.2 s
    claim = claim_output(f"gs://{BUCKET}/claims/beating", False, "beating")
    marker = gcs_bucket.blob(f"claims/beating/{MARKER_FILE}")
    marker.reload()
    first = float(marker.metadata[HEARTBEAT_KEY])  # read before the beats are watched
    beats = _HeldBeats(claim, monkeypatch)
    try:
        assert beats.landed.wait(beats.WAIT)
        beats.hold.set()
        # The one heartbeat thread now holds its next beat in flight: every earlier one has landed.
        assert beats.in_flight.wait(beats.WAIT)
        marker.reload()
        last = beats.log[-1][1]
        assert marker.metadata[HEARTBEAT_KEY] == last and float(last) > first  # refreshed while held
    finally:
        claim.release()
        beats.log.append(("released", None))
        beats.releasing.set()  # (a release that did not wait lets the held beat land only now)
    marker.reload()
    at_release = marker.metadata[HEARTBEAT_KEY]
    beats._join(beats.WAIT)
    assert not claim._alive._thread.is_alive()
    marker.reload()
    assert [event for event, _ in beats.log[-2:]] == ["landed", "released"]  # no beat after release
    assert marker.metadata[HEARTBEAT_KEY] == at_release == beats.log[-2][1]
