"""A pause point for fault-injection tests, inert unless its environment variable is set.

`IMG2TFRECORD_TEST_PAUSE=<point>:<flag file>` makes the run, on reaching `<point>`
('write_shard': a shard's first image written; 'publish': after the first file of the
dataset is renamed into place), create `<flag file>` and sleep, so a test can kill it at
exactly that moment. Production runs never set it; it reads nothing else and writes
nothing but the flag file the test named.
"""

from __future__ import annotations

import os
import time

PAUSE_ENV = "IMG2TFRECORD_TEST_PAUSE"
_PAUSE_SECONDS = 120


def pause_if_asked(point: str) -> None:
    """Sleeps at `point` if the test pause variable names it (see module docstring)."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    wanted, _, flag = spec.partition(":")
    if wanted != point or not flag:
        return
    with open(flag, "a"):
        pass
    time.sleep(_PAUSE_SECONDS)
