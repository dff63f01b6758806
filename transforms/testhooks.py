"""Seams for fault-injection tests, inert unless their environment variables are set.

`IMG2TFRECORD_TEST_PAUSE=<point>:<flag file>`: on reaching `<point>` ('write_shard': a
shard's first image written; 'publish': the first dataset file renamed into place) the run
creates `<flag file>` and sleeps until the test deletes it (at most 120 s), so a test can
kill, stop or resume it there; once resumed (`<flag file>.resumed` left) it does not pause
again. `IMG2TFRECORD_TEST_LEASE_SECONDS=<s>` shortens the claim's lease
(transforms/output/fence.py) in every process that inherits it, so a stalled run's lease
expires within a test.
"""

from __future__ import annotations

import os
import pathlib
import time

PAUSE_ENV = "IMG2TFRECORD_TEST_PAUSE"
LEASE_ENV = "IMG2TFRECORD_TEST_LEASE_SECONDS"
_PAUSE_SECONDS = 120


def pause_if_asked(point: str) -> None:
    """Sleeps at `point` if the test pause variable names it (see module docstring)."""
    wanted, _, flag = os.environ.get(PAUSE_ENV, "").partition(":")
    if wanted != point or not flag or os.path.exists(flag + ".resumed"):
        return
    pathlib.Path(flag).touch()
    deadline = time.monotonic() + _PAUSE_SECONDS
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    pathlib.Path(flag + ".resumed").touch()


def lease_seconds(default: float) -> float:
    """The claim's lease: `default`, or the test's shorter one (see module docstring)."""
    spec = os.environ.get(LEASE_ENV)
    return float(spec) if spec else default
