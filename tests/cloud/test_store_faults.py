"""A gs:// store that goes away: one line, exit 2, within the retry budget, never a traceback.

The CLI reaches the GCS emulator through a proxy (tests/gcs_emulator.py FaultProxy) that the
test takes down mid-run: new connections are refused and requests on open ones answer 503.
The retry budget (IMG2TFRECORD_RETRY_SECONDS, 60 s by default) is shortened to 3 s, so "within
~90 s" becomes "within ~30 s" here. Before: the outage was detected, then abandoning the claim
asked the unreachable store to delete the staging folder; GaveUp escaped after another full
retry: exit 1 and a 37-line traceback. A single-object input on an unreachable store gave a
31-line traceback from the input check.
"""

from __future__ import annotations

import os
import threading
import time

from tests.faults import convert, one_line, two_classes
from tests.gcs_emulator import BUCKET, FaultProxy, emulator_env, fake_credentials, free_port, upload_tree
from transforms.output.publish import MARKER_FILE, TEMP_PREFIX
from transforms.retry import BUDGET_ENV
from transforms.testhooks import LEASE_ENV, PAUSE_ENV


def test_a_store_gone_mid_run_ends_in_one_line_and_the_next_run_takes_over(gcs_bucket, tmp_path):
    tree = two_classes(tmp_path / "images", 6)
    upload_tree(gcs_bucket, tree, "gone/in")
    down = threading.Event()
    proxy = FaultProxy(os.environ["STORAGE_EMULATOR_HOST"], lambda *request: 503 if down.is_set() else None)
    flag, out = tmp_path / "paused", f"gs://{BUCKET}/gone/out"
    env = {
        **emulator_env(proxy.port, fake_credentials(tmp_path / "adc.json")),
        BUDGET_ENV: "3",
        PAUSE_ENV: f"write_shard:{flag}",
    }
    args = ["--input", f"gs://{BUCKET}/gone/in", "--output_dir", out]
    result: list = []
    run = threading.Thread(target=lambda: result.append(convert(args, env, limit=180)))
    run.start()
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert run.is_alive() and time.monotonic() < deadline, result or "never reached write_shard"
            time.sleep(0.05)
        down.set()
        proxy.close()  # the endpoint is gone: connections refused (open ones answer 503)
        gone = time.monotonic()
        flag.unlink()
        run.join(120)
    finally:
        down.set()
        proxy.close()
    status, stderr, _ = result[0]
    seconds = time.monotonic() - gone
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert "nothing was published" in line and "rerun when" in line, line
    assert line.endswith(
        "its marker and staged files stay (the next run takes them over 120 s after this one)"
    )
    assert seconds < 30, seconds  # the budget (3 s) and a little: no second full retry
    # What the line says is left: the marker (and what was staged, if anything), nothing published.
    left = {b.name.split("/")[2] for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="gone/out/")}
    assert left - {MARKER_FILE} <= {n for n in left if n.startswith(TEMP_PREFIX)} and MARKER_FILE in left, (
        left
    )
    # Once the store is back and the lease (shortened here) has run out, the same command succeeds.
    time.sleep(2)
    status, stderr, _ = convert(args, {LEASE_ENV: "2"}, limit=300)
    assert status == 0, stderr[-3000:]
    names = {b.name.split("/")[2] for b in gcs_bucket.client.list_blobs(gcs_bucket, prefix="gone/out/")}
    assert "summary.json" in names and MARKER_FILE not in names
    assert not any(n.startswith(TEMP_PREFIX) for n in names)


def test_a_single_object_input_on_an_unreachable_store_is_one_line(tmp_path):
    """Nothing listens at the store's address; the input check gives up within its budget."""
    env = {**emulator_env(free_port(), fake_credentials(tmp_path / "adc.json")), BUDGET_ENV: "3"}
    out = tmp_path / "out"
    status, stderr, seconds = convert(
        ["--input", f"gs://{BUCKET}/in/set.tar", "--output_dir", str(out)], env, limit=120
    )
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith(f"img2tfrecord: error: --input gs://{BUCKET}/in/set.tar: cannot list: "), line
    assert "Connection refused" in line and line.endswith("; rerun when it is reachable"), line
    assert seconds < 30
    assert not out.exists()  # checked before the output folder was claimed
