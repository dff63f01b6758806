"""A lease that cannot be renewed is not silent: after two missed beats in a row, each further
miss is a warning (on stderr in the launcher, in the log on a worker), naming the folder, the
error and how long the lease lasts. Before: logged at DEBUG only, so a claim could lapse (and
another run take the folder over) with nothing on screen.

The claim's store is the GCS emulator behind a proxy (tests/gcs_emulator.py FaultProxy) that
answers the marker's requests 503 while the test says so; the lease is shortened (a beat every
0.2 s) and a beat's own retry to 0.3 s.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tests.gcs_emulator import BUCKET, HOST, FaultProxy
from transforms.output import fence
from transforms.output.claim import claim_output
from transforms.retry import RetryPolicy
from transforms.testhooks import LEASE_ENV


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_missed_heartbeats_warn_after_two_and_stop_once_a_beat_lands(gcs_bucket, monkeypatch, caplog):
    failing = threading.Event()

    def marker_requests(method: str, path: str, body: bytes) -> int | None:
        return 503 if failing.is_set() and "in-progress" in path else None

    proxy = FaultProxy(os.environ["STORAGE_EMULATOR_HOST"], marker_requests)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{HOST}:{proxy.port}")
    monkeypatch.setenv(LEASE_ENV, "1.2")  # a beat every 0.2 s
    monkeypatch.setattr(fence, "REQUEST_RETRY", RetryPolicy(initial_delay=0.05, deadline=0.3).as_api_retry())
    out = f"gs://{BUCKET}/leases/out"
    claim = claim_output(out, False, "beating")
    try:
        with caplog.at_level(logging.WARNING):
            time.sleep(1)
            assert _warnings(caplog) == []  # beats land: nothing to say
            failing.set()
            deadline = time.monotonic() + 20
            while len(_warnings(caplog)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            first, second = _warnings(caplog)[:2]
            assert first.startswith(
                f"img2tfrecord: the claim on {out} was not renewed 2 times in a row (last: "
            )
            assert first.endswith("if this goes on for 1 s, another run may take the folder over"), first
            assert "503" in first and " 3 times in a row" in second
            assert proxy.faulted >= 3
            failing.clear()
            time.sleep(1)  # beats land again: the count starts over
            quiet = len(_warnings(caplog))
            time.sleep(1)
            assert len(_warnings(caplog)) == quiet
    finally:
        failing.clear()
        claim.release()
        proxy.close()
