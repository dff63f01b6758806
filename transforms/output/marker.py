"""The in-progress marker file: its content, its owner, its lock (pure, and local file calls).

Shared by the claim (claim.py: a local lock or a gs:// lease) and the fence (fence.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time

from transforms.testhooks import lease_seconds as _test_lease

# Writability probes of earlier versions (created and deleted before the marker was
# written): a run killed in between left one behind. The claim deletes them.
PROBE_PREFIX = ".img2tfrecord-probe-"


# Leases (every gs:// marker; a local one whose job runs outside the launcher): how often the
# live run refreshes its heartbeat, and how old a heartbeat may be before its run counts as
# dead (six missed refreshes).
HEARTBEAT_SECONDS = 20.0


LEASE_SECONDS = 120.0


HEARTBEAT_KEY = "img2tfrecord-heartbeat"


# Attempts at claiming while other runs create, take over or remove the marker meanwhile.
CLAIM_TRIES = 5


# flock errors meaning "this filesystem has no locks" (some FUSE mounts): the claim is then
# exclusive at creation only, and an existing marker counts as a dead run's.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})


def lease_seconds() -> float:
    """LEASE_SECONDS, or the shorter lease a fault-injection test asked for (transforms/testhooks.py)."""
    return _test_lease(LEASE_SECONDS)


def heartbeat_seconds() -> float:
    """HEARTBEAT_SECONDS, or a sixth of a test's shorter lease."""
    return min(HEARTBEAT_SECONDS, lease_seconds() / 6)


class NotWritable(ValueError):
    """The output folder cannot be written; the message says why (one line)."""


def not_writable(output_dir: str, error: OSError | str) -> NotWritable:
    reason = error if isinstance(error, str) else error.strerror or str(error)
    return NotWritable(f"--output_dir {output_dir} is not writable: {reason}")


def marker_content(run_id: str, job: bool = False) -> bytes:
    """The marker's JSON: who claimed the folder and when, and whether the job keeps the claim
    (fence.py). The run id is the claim's token on local folders; host, pid and time are for people."""
    content = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    if job:
        content["job"] = True
    return json.dumps(content).encode("utf-8")


def parse_marker(content: bytes) -> dict:
    """A marker's JSON as a dict; {} for a marker cut short or empty (a kill while it was written)."""
    try:
        found = json.loads(content.decode("utf-8"))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def marker_owner(previous: dict) -> str:
    """`previous` marker's owner for a message: 'run <id>, pid <n> on <host>'."""
    parts = [f"run {previous.get('run_id', 'unknown')}"]
    if previous.get("pid") is not None:
        parts.append(f"pid {previous['pid']} on {previous.get('host', '?')}")
    return ", ".join(parts)


def same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def lock(fd: int, shared: bool) -> bool:
    """Locks the marker: shared waits out a claim in progress; exclusive does not wait and
    returns False if another process holds it. True on a filesystem without locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            raise
        if not shared:
            logging.warning(
                "the filesystem of the output folder has no file locks: a killed run's marker is taken over"
            )
    return True


def read_fd(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
