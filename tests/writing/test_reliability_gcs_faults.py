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
import re
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from tests.gcs_emulator import HOST, emulator_env, fake_credentials, free_port
from transforms.encoding.encoder import EncodeSettings
from transforms.failures import user_error_text
from transforms.gcs import read as read_gcs
from transforms.images.read import ReadError, read_bytes, read_with_retries
from transforms.records import ClassIndex, ImageRecord, ShardTask
from transforms.retry import DEFAULT_RETRY, RetryPolicy, StoreHealth, StoreUnreachable
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
