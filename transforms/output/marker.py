"""The in-progress marker: its content, its owner, and the Claim every kind of claim is (pure).

Shared by the local claim (claim.py, a lock) and the gs:// lease (lease.py, a heartbeat).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from apache_beam.io.filesystems import FileSystems

from transforms.output.publish import MARKER_FILE, temp_dir_for
from transforms.testhooks import lease_seconds as _test_lease
from transforms.writing.files import delete_paths

# Writability probes of earlier versions (created and deleted before the marker was
# written): a run killed in between left one behind. The claim deletes them.
PROBE_PREFIX = ".img2tfrecord-probe-"


# Leases (every gs:// marker; a local one whose job runs outside the launcher): how often the
# live run refreshes its heartbeat, and how old a heartbeat may be before its run counts as
# dead (six missed refreshes).
HEARTBEAT_SECONDS = 20.0


LEASE_SECONDS = 120.0


def lease_seconds() -> float:
    """LEASE_SECONDS, or the shorter lease a fault-injection test asked for (transforms/testhooks.py)."""
    return _test_lease(LEASE_SECONDS)


def heartbeat_seconds() -> float:
    """HEARTBEAT_SECONDS, or a sixth of a test's shorter lease."""
    return min(HEARTBEAT_SECONDS, lease_seconds() / 6)


HEARTBEAT_KEY = "img2tfrecord-heartbeat"


# Attempts at claiming while other runs create, take over or remove the marker meanwhile.
CLAIM_TRIES = 5


class NotWritable(ValueError):
    """The output folder cannot be written; the message says why (one line)."""


def marker_content(run_id: str, job: bool = False) -> bytes:
    """The marker's JSON: who claimed the folder and when, and whether the job keeps the claim
    (`job`: its steps beat a lease; see transforms/output/fence.py). The run id is the claim's
    token on local folders; host, pid and time are for people."""
    content = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    if job:
        content["job"] = True
    return json.dumps(content).encode("utf-8")


def parse_marker(content: bytes) -> dict:
    """A marker's JSON as a dict; {} for a marker cut short or empty (a kill while it was written)."""
    try:
        found = json.loads(content.decode("utf-8"))
    except ValueError:
        return {}  # cut short or empty: a kill while it was written
    return found if isinstance(found, dict) else {}


def marker_owner(previous: dict) -> str:
    """`previous` marker's owner for a message: 'run <id>, pid <n> on <host>'."""
    parts = [f"run {previous.get('run_id', 'unknown')}"]
    if previous.get("pid") is not None:
        parts.append(f"pid {previous['pid']} on {previous.get('host', '?')}")
    return ", ".join(parts)


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


class Claim:
    """A held claim on an output folder (see the module docstring).

    Attributes:
      output_dir: the folder claimed.
      run_id: the run holding it.
      resumed: the id of the dead run whose marker was taken over ('unknown' if its marker
        was cut short), or None for a fresh claim.
      job: the job keeps the claim alive (a runner outside this process; see fence.py).
      generation: the gs:// marker's generation (the claim's token there); None locally.
    """

    generation: int | None = None

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, job: bool = False):
        self.output_dir, self.run_id, self.resumed, self.job = output_dir, run_id, resumed, job

    @property
    def marker_path(self) -> str:
        return FileSystems.join(self.output_dir, MARKER_FILE)

    def owns_marker(self) -> bool:
        """True while the marker in the folder is still this claim's."""
        raise NotImplementedError

    def _remove_marker(self) -> None:
        raise NotImplementedError

    def release(self, abandon: bool = False) -> None:
        """Ends the claim. The marker itself is removed by publishing, not here.

        Args:
          abandon: the run stops before publishing anything (a user error found inside
            the pipeline, a dry run): its staging folder is deleted and, if the claim was
            fresh, its marker too, so the folder is left as the run found it. A taken-over
            marker stays: the dead run's leftovers it covers are still there.
        """
        try:
            if abandon:
                delete_paths([temp_dir_for(self.output_dir, self.run_id)])
                if self.resumed is None and self.owns_marker():
                    self._remove_marker()
        finally:
            self._close()

    def _close(self) -> None:
        """Lets go of the lock or stops the heartbeat."""


def heartbeat_thread(beat, interval: float) -> tuple[threading.Thread, threading.Event]:
    """Calls `beat()` every `interval` seconds in a daemon thread until the event is set or
    `beat` returns False."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            if not beat():
                return

    thread = threading.Thread(target=loop, name="img2tfrecord-heartbeat", daemon=True)
    thread.start()
    return thread, stop
