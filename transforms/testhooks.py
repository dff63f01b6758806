"""Seams for fault-injection tests, inert unless their environment variables are set.

`IMG2TFRECORD_TEST_PAUSE=<point>:<flag file>` makes the run, on reaching `<point>`
('write_shard': a shard's first image written; 'publish': after the first file of the
dataset is renamed into place), create `<flag file>` and sleep until the test deletes it
(at most 120 s), so a test can kill, stop or resume it at exactly that moment; once resumed
(`<flag file>.resumed` is left) it passes the point without pausing again.
`IMG2TFRECORD_TEST_LEASE_SECONDS=<s>` shortens the claim's lease (transforms/output/fence.py)
in every process that inherits it (launcher, worker pool), so a stalled run's lease expires
within a test. Production runs set neither; they read nothing else and write nothing but the
flag file the test named.
"""

from __future__ import annotations

import os
import time

PAUSE_ENV = "IMG2TFRECORD_TEST_PAUSE"
LEASE_ENV = "IMG2TFRECORD_TEST_LEASE_SECONDS"
_PAUSE_SECONDS = 120


def pause_if_asked(point: str) -> None:
    """Sleeps at `point` if the test pause variable names it (see module docstring)."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    wanted, _, flag = spec.partition(":")
    if wanted != point or not flag or os.path.exists(flag + ".resumed"):
        return
    with open(flag, "a"):
        pass
    deadline = time.monotonic() + _PAUSE_SECONDS
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(flag + ".resumed", "a"):
        pass


def lease_seconds(default: float) -> float:
    """The claim's lease: `default`, or the test's shorter one (see module docstring)."""
    spec = os.environ.get(LEASE_ENV)
    return float(spec) if spec else default
