"""gs:// that does not recover: every object read within its budget, a dead store stops the job.

The store is a local HTTP server that answers the GCS download API badly on purpose (503
for everything, or no answer at all), or a port nobody listens on (an endpoint that
disappeared); Google's client reaches it through STORAGE_EMULATOR_HOST, as in
tests/gcs_emulator.py. Sleeps between retries are recorded, not slept, where the count of
attempts is the point.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from tests.gcs_emulator import BUCKET, HOST, FaultProxy, emulator_env, fake_credentials, free_port
from transforms import gcs
from transforms.encoding.encoder import EncodeSettings
from transforms.failures import user_error_text
from transforms.gcs import read as read_gcs
from transforms.images.read import ReadError, read_bytes, read_with_retries
from transforms.listing.members import member_address
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.retry import BUDGET_ENV, DEFAULT_RETRY, RetryPolicy, StoreHealth, StoreUnreachable
from transforms.writing.beam import WriteShards


class _FaultyGcs(http.server.ThreadingHTTPServer):
    """Answers every request with 503, or (`silent`) never answers; counts the object downloads."""

    daemon_threads = True

    def __init__(self, silent: bool = False):
        self.requests, self.silent, self.stopping = 0, silent, threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += self.path.startswith("/download/")
                if server.silent:
                    server.stopping.wait(30)
                    return
                body = b'{"error": {"code": 503, "message": "backend error"}}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        super().__init__((HOST, 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


def _point_at(monkeypatch, tmp_path, port: int) -> None:
    for key, value in emulator_env(port, fake_credentials(tmp_path / "adc.json")).items():
        monkeypatch.setenv(key, value)


def _in_thread(fn, limit: float):
    """Runs `fn()` in a thread; (result or exception, seconds taken), or fails after `limit` s."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still running after {limit:g} s"
    return out[0], time.monotonic() - start


def test_an_object_that_always_answers_503_fails_after_the_promised_attempts(monkeypatch, tmp_path):
    server = _FaultyGcs()
    try:
        _point_at(monkeypatch, tmp_path, server.server_address[1])
        slept: list[float] = []
        read = functools.partial(
            read_with_retries, "gs://bucket/a.png", read_bytes, DEFAULT_RETRY, slept.append
        )
        error, seconds = _in_thread(read, 30)
    finally:
        server.close()
    assert isinstance(error, ReadError) and "still failing after 5 attempts" in str(error), error
    # One request per attempt: the client retries nothing behind the policy's back.
    assert server.requests == 5 and len(slept) == 4 and seconds < 10
    assert sum(slept) <= (0.5 + 1 + 2 + 4) * 1.5  # 0.5 s doubling, jittered by at most half


def test_an_archive_member_that_always_answers_503_fails_after_the_promised_attempts(monkeypatch, tmp_path):
    """A tar member is read as plain objects are: one ranged request per attempt of the policy
    (it used the storage client's own retry: ~10 requests over 85-113 s)."""
    server = _FaultyGcs()
    try:
        _point_at(monkeypatch, tmp_path, server.server_address[1])
        slept: list[float] = []
        member = member_address("gs://bucket/set.tar", "cat/a.png", 512, 100)
        read = functools.partial(read_with_retries, member, read_bytes, DEFAULT_RETRY, slept.append)
        error, seconds = _in_thread(read, 30)
    finally:
        server.close()
    assert isinstance(error, ReadError) and "still failing after 5 attempts" in str(error), error
    assert server.requests == 5 and len(slept) == 4 and seconds < 10


def test_an_object_that_never_answers_fails_within_its_deadline(monkeypatch, tmp_path):
    server = _FaultyGcs(silent=True)
    try:
        _point_at(monkeypatch, tmp_path, server.server_address[1])
        policy = RetryPolicy(attempts=10, initial_delay=0.01, deadline=1.5)
        read = functools.partial(
            read_with_retries, "gs://bucket/a.png", functools.partial(read_gcs, timeout=0.5), policy
        )
        error, seconds = _in_thread(read, 20)
    finally:
        server.close()
    assert isinstance(error, ReadError) and "still failing after" in str(error), error
    assert 2 <= server.requests < 10 and seconds < 1.5 + 0.5 + 1  # deadline + one request timeout + slack


def test_store_health_trips_only_when_nothing_succeeds():
    now = [0.0]
    health = StoreHealth(clock=lambda: now[0])
    for t in range(0, 60, 5):  # one bad object among good ones: never down
        now[0] = float(t)
        health.failed("gs://b", "503", down_after=30)
        health.succeeded("gs://b")
    health.failed(None, "EIO", down_after=0)  # local files are not watched
    now[0] = 100.0
    health.failed("gs://b", "refused", down_after=30)
    now[0] = 129.0
    health.failed("gs://b", "refused", down_after=30)
    now[0] = 130.0
    with pytest.raises(
        StoreUnreachable, match="gs://b answered nothing but errors for 30 s \\(last: refused\\)"
    ):
        health.failed("gs://b", "refused", down_after=30)


def test_an_endpoint_that_disappeared_stops_the_job_with_one_line(monkeypatch, tmp_path):
    """Nothing listens at the store's address: the job stops after `store_down`, not after
    every image has used its own retries."""
    _point_at(monkeypatch, tmp_path, free_port())
    policy = RetryPolicy(attempts=3, initial_delay=0.05, max_delay=0.1, store_down=1.0)
    records = tuple(ImageRecord(f"gs://bucket/c/{i}.png", f"c/{i}.png", 100, ("c",)) for i in range(400))

    def run() -> None:
        with TestPipeline() as p:
            index = p | "Index" >> beam.Create([ClassIndex(("c",))])
            tasks = p | beam.Create([ShardTask("train", 0, records)])
            _ = tasks | WriteShards(
                str(tmp_path / "out"),
                str(tmp_path / "tmp"),
                index,
                "none",
                EncodeSettings(),
                retry=policy,
                threads=1,
            )

    error, seconds = _in_thread(run, 60)
    assert isinstance(error, Exception), "the job went on as if the store were there"
    line = user_error_text(str(error))
    assert re.fullmatch(
        r"gs://bucket answered nothing but errors for \d+ s \(last: .*Connection refused\); .*", line
    )
    assert seconds < 20


def _cli(args: list[str], env: dict[str, str], limit: float) -> tuple[int, list[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *args, "--quiet"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=limit,
    )
    return proc.returncode, proc.stderr.strip().splitlines(), time.monotonic() - start


def test_a_gs_output_that_refuses_every_upload_ends_with_one_line(gcs_bucket, image_tree, tmp_path):
    """The run claims its gs:// folder, then every upload of its staged files answers 503: the
    writes give up within the retry budget (IMG2TFRECORD_RETRY_SECONDS, shortened here) and the
    job ends with one line, exit 2 (it was the client's 120 s upload retry, then exit 1 and a
    589-line traceback)."""

    def staged_uploads(method: str, path: str, body: bytes) -> int | None:
        if method in ("POST", "PUT") and path.startswith("/upload/") and b"beam-temp" in path.encode() + body:
            return 503
        return None

    emulator = os.environ["STORAGE_EMULATOR_HOST"]
    proxy = FaultProxy(emulator, staged_uploads)
    try:
        env = {**emulator_env(proxy.port, fake_credentials(tmp_path / "adc.json")), BUDGET_ENV: "2"}
        out = f"gs://{BUCKET}/refused-out"
        status, lines, seconds = _cli(["--input", str(image_tree), "--output_dir", out], env, 120)
    finally:
        proxy.close()
    assert proxy.faulted >= 2, "no upload was refused: the fault was not injected"
    assert status == 2, lines
    assert len(lines) == 1 and re.fullmatch(
        rf"img2tfrecord: error: cannot write {out}/beam-temp-img2tfrecord-\w+/.*: .*503.*; "
        r"nothing was published, rerun when the bucket is writable",
        lines[0],
    ), lines
    assert seconds < 45
    # The claim was given up: no marker, nothing published.
    assert [b.name for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="refused-out/")] == []


def test_listing_pages_and_batches_answered_503_once_are_asked_again(gcs_bucket, monkeypatch):
    """One request per attempt, made again under the policy: a listing page (asked for by its
    token on a fresh request: a page iterator that raised would end the listing early) and a
    batch of renames, each refused once with 503, still list and rename everything."""
    names = [f"once/src/{i:03d}.png" for i in range(150)]
    for name in names:
        gcs_bucket.blob(name).upload_from_string(name.encode())
    refused: list[str] = []

    def first_of_each_kind(method: str, path: str, body: bytes) -> int | None:
        kind = (
            "batch" if path.startswith("/batch/") else "list" if "/o?" in path and method == "GET" else None
        )
        if kind is None or kind in refused:
            return None
        refused.append(kind)
        return 503

    proxy = FaultProxy(os.environ["STORAGE_EMULATOR_HOST"], first_of_each_kind)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{HOST}:{proxy.port}")
        listed = [name for name, _ in gcs.lister(BUCKET)("once/src/", None)]
        gcs.rename_batch([(f"gs://{BUCKET}/{n}", f"gs://{BUCKET}/{n.replace('src', 'dst')}") for n in listed])
    finally:
        proxy.close()
    assert refused == ["list", "batch"]
    assert listed == names
    moved = sorted(b.name for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="once/"))
    assert moved == [n.replace("src", "dst") for n in names]
