"""Claiming an output folder: one live run at a time, a dead run's leftovers cleaned.

In: an output folder (local or gs://), a run id and --overwrite. Out: a `Claim` held until
the run ends, or OutputBusy / NotWritable with a one-line reason. The claim is the marker
`.img2tfrecord-in-progress.json`, created exclusively; its liveness never rests on a pid.
docs/reliability.md ("One run per folder") states the promises.

- **Local folders: a lock held by the live process** (`flock`, which the kernel drops however
  the process dies; NFS too). A claim takes it exclusively, writes its content, then holds it
  shared, as the fenced steps do (fence.py). A marker whose lock can be taken is a dead run's
  and is taken over, unless it says `"job": true` and its modification time (the job's beat)
  is younger than the lease. After locking, a run checks that the marker's name still points
  at the file it locked, so a claim slipped between another's create and lock loses cleanly.
  The marker is the writability probe too: a fresh one that cannot be written is removed.
- **gs:// folders: a lease.** The marker is uploaded with `if_generation_match=0`, its
  heartbeat refreshed by fence.py's KeepAlive; one older than LEASE_SECONDS is a dead run's,
  taken over by an upload conditional on its generation (of two, exactly one wins).

Once claimed, dead runs' staging folders and earlier versions' probes are deleted, and the
dataset files the folder holds are noted (`Claim.found`): a run that stops before publishing
removes its fresh marker only while the folder still holds just those (fence.py `abandon`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import time

from apache_beam.io.filesystems import FileSystems
from google.api_core import exceptions as gexc

from transforms import gcs
from transforms.output.fence import (
    HEARTBEAT_KEY,
    REQUEST_RETRY,
    Claim,
    Fence,
    KeepAlive,
    heartbeat_age,
    lease_seconds,
    lock,
    parse_marker,
    read_fd,
    same_file,
)
from transforms.output.publish import MARKER_FILE, TEMP_PREFIX, OutputBusy, is_dataset_file, list_children
from transforms.retry import StoreUnreachable
from transforms.writing.files import delete_paths

# Writability probes of earlier versions (created and deleted before the marker was
# written): a run killed in between left one behind. The claim deletes them.
PROBE_PREFIX = ".img2tfrecord-probe-"

# Attempts at claiming while other runs create, take over or remove the marker meanwhile.
CLAIM_TRIES = 5


class NotWritable(ValueError):
    """The output folder cannot be written; the message says why (one line)."""


def not_writable(output_dir: str, error: OSError | str) -> NotWritable:
    reason = error if isinstance(error, str) else error.strerror or str(error)
    return NotWritable(f"--output_dir {output_dir} is not writable: {reason}")


def marker_content(run_id: str, job: bool = False) -> bytes:
    """The marker's JSON: who claimed the folder, when, and whether the job keeps the claim.
    The run id is the claim's token on local folders; host, pid and time are for people."""
    content = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    if job:
        content["job"] = True
    return json.dumps(content).encode("utf-8")


def marker_owner(previous: dict) -> str:
    """`previous` marker's owner for a message: 'run <id>, pid <n> on <host>'."""
    parts = [f"run {previous.get('run_id', 'unknown')}"]
    if previous.get("pid") is not None:
        parts.append(f"pid {previous['pid']} on {previous.get('host', '?')}")
    return ", ".join(parts)


# Descriptors of the markers this process holds locked. A forked child (a shard writer,
# transforms/writing/processes.py) closes its copies at once, so the lock lives exactly as
# long as the claiming process: closing a copy does not unlock the parent's.
_HELD_FDS: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


@functools.cache
def _watch_forks() -> None:
    """Registers the fork hook at the first local claim (importing changes no process state)."""
    os.register_at_fork(after_in_child=_close_held_in_child)


class LocalClaim(Claim):
    """A claim on a local folder: the marker is open and `flock`ed by this process."""

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, fd: int, job: bool):
        super().__init__(output_dir, run_id, resumed, job, None)
        self._fd: int | None = fd
        _watch_forks()
        _HELD_FDS.add(fd)

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _HELD_FDS.discard(fd)
            os.close(fd)  # drops the lock


def _write_fd(fd: int, data: bytes) -> None:
    """Writes `data` as the file's whole content and flushes it to the disk (ENOSPC shows here)."""
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _file_in_the_way(path: str) -> str:
    """The nearest existing path at or above `path` (the file that keeps it from being a folder)."""
    while path and not os.path.lexists(path):
        path = os.path.dirname(path.rstrip(os.sep))
    return path


def claim_local(output_dir: str, run_id: str, job: bool = False) -> LocalClaim:
    """Creates and locks the marker of a local folder, or takes over a dead run's. Raises
    NotWritable (the folder or the marker cannot be written; nothing is left) or OutputBusy."""
    marker = os.path.join(output_dir, MARKER_FILE)
    try:
        os.makedirs(output_dir, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotWritable(
            f"--output_dir {output_dir}: {_file_in_the_way(output_dir)} is a file, not a folder; "
            "pass the path of a folder (it is created if missing)"
        ) from None
    except OSError as e:
        raise not_writable(output_dir, e) from None
    for _ in range(CLAIM_TRIES):
        try:
            fd, fresh = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, fresh = os.open(marker, os.O_RDWR), False
            except FileNotFoundError:
                continue  # published or abandoned meanwhile
            except OSError as e:
                raise not_writable(output_dir, e) from None
        except OSError as e:
            raise not_writable(output_dir, e) from None
        try:
            previous = {} if fresh else parse_marker(read_fd(fd))
            if not lock(fd, shared=False):
                raise OutputBusy(
                    f"--output_dir {output_dir} is being written by another img2tfrecord run ({marker_owner(previous)})"
                )
            if not same_file(fd, marker):
                os.close(fd)  # replaced or removed between our open and our lock
                continue
            age = time.time() - os.fstat(fd).st_mtime
            if previous.get("job") and age < lease_seconds():
                raise OutputBusy(
                    f"--output_dir {output_dir} is being written by the job of another img2tfrecord run "
                    f"({marker_owner(previous)}, alive {age:.0f} s ago; a dead job's claim expires after "
                    f"{lease_seconds():.0f} s)"
                )
            try:
                _write_fd(fd, marker_content(run_id, job))
            except OSError as e:
                if fresh:
                    os.unlink(marker)  # ours, still locked: a failed claim leaves nothing
                raise not_writable(output_dir, e) from None
            # Shared from now on, so the job's fenced steps can lock it too. (The change is not
            # atomic: a claim that slips in sees a live marker or takes it over, then this
            # run finds another run id in it and is refused.)
            lock(fd, shared=True)
            if parse_marker(read_fd(fd)).get("run_id") != run_id:
                raise OutputBusy(
                    f"--output_dir {output_dir} was claimed by another img2tfrecord run meanwhile"
                )
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return LocalClaim(output_dir, run_id, None if fresh else previous.get("run_id", "unknown"), fd, job)
    raise OutputBusy(f"--output_dir {output_dir}: other img2tfrecord runs keep claiming it; try again")


class RemoteClaim(Claim):
    """A claim on a gs:// folder: the marker object at `generation`, kept alive by a thread."""

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, generation: int, job: bool):
        super().__init__(output_dir, run_id, resumed, job, generation)
        self._alive = KeepAlive(Fence.of(self), active=True)

    def _stop_beating(self, wait: bool = True) -> None:
        self._alive.stop(wait)  # (wait: no beat lands after the claim is released)


def claim_remote(output_dir: str, run_id: str, job: bool = False) -> RemoteClaim:
    """Creates the marker of a gs:// folder, or takes over a dead run's. Raises NotWritable
    (no permission, no such bucket, no answer) or OutputBusy (a fresh heartbeat)."""
    blob = gcs.blob(f"{output_dir.rstrip('/')}/{MARKER_FILE}")

    def upload(generation: int) -> int:
        blob.metadata = {HEARTBEAT_KEY: repr(time.time())}
        blob.upload_from_string(
            marker_content(run_id, job),
            content_type="application/json",
            if_generation_match=generation,
            retry=REQUEST_RETRY,
        )
        return blob.generation

    try:
        for _ in range(CLAIM_TRIES):
            try:
                return RemoteClaim(output_dir, run_id, None, upload(0), job)
            except gexc.PreconditionFailed:
                pass
            existing = blob.bucket.get_blob(blob.name, retry=REQUEST_RETRY)
            if existing is None:
                continue  # published or abandoned meanwhile
            previous = parse_marker(existing.download_as_bytes(retry=REQUEST_RETRY))
            if previous.get("run_id") == run_id:  # our own create, retried after a lost answer
                return RemoteClaim(output_dir, run_id, None, existing.generation, job)
            age = heartbeat_age(existing)
            if age < lease_seconds():
                raise OutputBusy(
                    f"--output_dir {output_dir} is being written by another img2tfrecord run "
                    f"({marker_owner(previous)}, alive {age:.0f} s ago; a dead run's claim expires after "
                    f"{lease_seconds():.0f} s)"
                )
            try:
                generation = upload(existing.generation)
            except gexc.PreconditionFailed:
                continue  # another run took it over first
            return RemoteClaim(output_dir, run_id, previous.get("run_id", "unknown"), generation, job)
    except gexc.GoogleAPICallError as e:
        raise not_writable(output_dir, (str(e).strip().splitlines() or [type(e).__name__])[0]) from None
    except gexc.RetryError as e:
        raise not_writable(output_dir, str(e.cause or e)) from None
    raise OutputBusy(f"--output_dir {output_dir}: other img2tfrecord runs keep claiming it; try again")


def claim_output(output_dir: str, overwrite: bool, run_id: str, job: bool = False) -> Claim:
    """Claims `output_dir` for run `run_id` and deletes what dead runs left there.

    A folder holding a finished dataset (or shards of unknown origin) needs `overwrite`, else
    OutputBusy; a dead run's leftovers do not, so a scheduler's retry succeeds. NotWritable
    leaves nothing. `job`: the job runs outside this process and keeps the claim alive.
    """
    claim = (
        claim_remote(output_dir, run_id, job) if "://" in output_dir else claim_local(output_dir, run_id, job)
    )
    try:
        names = list_children(output_dir)
        claim.found = frozenset(n for n in names if is_dataset_file(n))
        if claim.resumed is None and not overwrite and claim.found:
            raise OutputBusy(
                f"--output_dir {output_dir} already holds a dataset; pass --overwrite to replace it"
            )
        leftovers = [n for n in names if n.startswith((TEMP_PREFIX, PROBE_PREFIX))]
        delete_paths([FileSystems.join(output_dir, n) for n in leftovers])
    except (*gcs.ERRORS, StoreUnreachable):  # the store does not answer: ask it nothing more
        claim.let_go()
        raise
    except BaseException:
        claim.abandon()
        raise
    return claim
