"""The in-progress marker, the claim and its token: every change to the output is fenced.

In: a held claim (claim.py). Out: `Fence`, a small picklable token the graph ships to the
steps that touch the output folder, and ClaimLost (one line, exit 2) once another run took
the folder over; also the marker's content, lock and lease, shared with claim.py.
docs/reliability.md ("Fencing") states the guarantees and their limits.

- `with fence.held() as keep:` wraps every change. Locally the marker is `flock`ed shared for
  the block and must still name this run; a claim needs the lock exclusively, so check and
  change are atomic. On gs:// (no locks) the block renews the lease by a patch conditional
  on the marker's generation, and `keep()` again once half a heartbeat has passed: a renewal
  that succeeds proves the marker is this run's and keeps others out for a whole lease.
- `KeepAlive` beats the lease from a thread: the launcher's on gs://, and the job's long
  steps when the job runs outside the launcher (`job`), so a killed launcher does not free
  the folder and an orphaned job that lost it stops at its next beat (a local marker's beat
  is its modification time). Beats are conditional on the metageneration just read and
  skipped while the last is younger than a heartbeat: about one write a heartbeat however
  many workers beat (GCS allows one a second on one object). After MISSES_TO_WARN missed
  beats in a row, each further miss is a warning: a lease never lapses silently.
- A claim ends as the run does (`Claim`): released once published; abandoned by a run that
  stops before publishing while nothing of its job runs (its staging folder deleted, a fresh
  marker removed unless publishing had begun); a marker that stays then has its lease ended
  (`expire`), so the next run takes it over at once; `let_go` asks nothing of a store that
  does not answer (beam_pipeline/cli/faults.py decides which).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from apache_beam.io.filesystems import FileSystems
from google.api_core import exceptions as gexc

from transforms import gcs
from transforms.failures import USER_ERROR_MARKER
from transforms.output.publish import MARKER_FILE, is_dataset_file, list_children, temp_dir_for
from transforms.retry import DEFAULT_RETRY, describe
from transforms.testhooks import lease_seconds as _test_lease
from transforms.writing.files import delete_paths

# Leases (gs://; a local marker whose job runs outside the launcher): how often the live run
# beats, and how old a beat may be before its run counts as dead (six missed beats).
HEARTBEAT_SECONDS = 20.0
LEASE_SECONDS = 120.0
HEARTBEAT_KEY = "img2tfrecord-heartbeat"
# Missed beats in a row after which each further one is a warning (stderr, the worker's log).
MISSES_TO_WARN = 2

# flock errors of a filesystem without locks (some FUSE mounts): a marker there is a dead run's.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})


def lease_seconds() -> float:
    """LEASE_SECONDS, or the shorter lease a fault-injection test asked for (transforms/testhooks.py)."""
    return _test_lease(LEASE_SECONDS)


def heartbeat_seconds() -> float:
    """HEARTBEAT_SECONDS, or a sixth of a test's shorter lease."""
    return min(HEARTBEAT_SECONDS, lease_seconds() / 6)


def parse_marker(content: bytes) -> dict:
    """A marker's JSON as a dict; {} for a marker cut short or empty (a kill while it was written)."""
    try:
        found = json.loads(content.decode("utf-8"))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


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


# One request's retries (503s, resets): the one retry policy's, so a claim never hangs on a
# bucket that does not answer (transforms/retry.py).
REQUEST_RETRY = DEFAULT_RETRY.as_api_retry()


# How ClaimLost's line starts (the run's end reads it: the folder is another run's).
TAKEN_OVER = "another run took over"


class ClaimLost(RuntimeError):
    """Another run took the output folder over; this run must change nothing there."""


@dataclasses.dataclass(frozen=True)
class Fence:
    """A claim's token: the run id locally, the marker's `generation` on gs:// (None locally);
    `job`: the job's steps keep the claim alive (`keep_alive`)."""

    output_dir: str
    run_id: str
    generation: int | None = None
    job: bool = False

    @classmethod
    def of(cls, claim: Claim) -> Fence:
        """The token of a held claim, for the job's steps."""
        return cls(claim.output_dir, claim.run_id, claim.generation, claim.job)

    @property
    def marker_path(self) -> str:
        return FileSystems.join(self.output_dir, MARKER_FILE)

    def lost(self) -> ClaimLost:
        return ClaimLost(
            f"{USER_ERROR_MARKER} {TAKEN_OVER} --output_dir {self.output_dir}; this run "
            f"({self.run_id}) stopped without changing it (the folder is the other run's)"
        )

    @contextlib.contextmanager
    def held(self) -> Iterator[Callable[[], None]]:
        """The block in which a step changes the published folder; yields `keep()`, to call
        between its steps (see the module docstring). Raises ClaimLost."""
        if self.generation is not None:
            self.beat(force=True)
            renewed = [time.monotonic()]

            def keep() -> None:
                if time.monotonic() - renewed[0] > heartbeat_seconds() / 2:
                    self.beat(force=True)
                    renewed[0] = time.monotonic()

            yield keep
            return
        try:
            fd = os.open(self.marker_path, os.O_RDONLY)
        except FileNotFoundError:
            raise self.lost() from None
        try:
            lock(fd, shared=True)
            if parse_marker(read_fd(fd)).get("run_id") != self.run_id or not same_file(fd, self.marker_path):
                raise self.lost()
            if self.job:
                os.utime(fd)  # the local lease's heartbeat
            yield lambda: None
        finally:
            os.close(fd)

    def beat(self, force: bool = False) -> None:
        """Refreshes the lease (`force` False: only if the last beat is older than a heartbeat).
        Locally, checks the marker (and touches a job-kept one). Raises ClaimLost."""
        if self.generation is None:
            with self.held():
                pass
        elif not renew(gcs.blob(self.marker_path), self.generation, force):
            raise self.lost()

    def remove_marker(self) -> None:
        """Removes the marker if it is still this run's (the dataset is finished)."""
        if self.generation is not None:
            with contextlib.suppress(gexc.PreconditionFailed, gexc.NotFound):
                gcs.blob(self.marker_path).delete(if_generation_match=self.generation, retry=REQUEST_RETRY)
            return
        with contextlib.suppress(ClaimLost), self.held():
            os.unlink(self.marker_path)

    def expire(self) -> None:
        """Ends the lease of this run's marker, if it is still there and still this run's: the
        run is over and nothing of its job runs, so the next run takes the marker over at once
        (on gs:// its heartbeat set to 0; locally a job-kept marker's beat, its modification
        time; a local marker without `job` is free as soon as the claim's lock is let go)."""
        if self.generation is not None:
            blob = gcs.blob(self.marker_path)
            blob.metadata = {HEARTBEAT_KEY: "0"}
            with contextlib.suppress(gexc.PreconditionFailed, gexc.NotFound):
                blob.patch(if_generation_match=self.generation, retry=REQUEST_RETRY)
            return
        if self.job:
            with contextlib.suppress(ClaimLost), self.held():
                os.utime(self.marker_path, (0, 0))

    def keep_alive(self) -> KeepAlive:
        """A heartbeat for a step of the job (started/stopped per bundle); inert unless `job`.
        A job-kept claim is checked at once: an orphaned job stops before writing into the folder."""
        if self.job:
            self.beat()
        return KeepAlive(self, self.job)


def heartbeat_age(blob) -> float:
    """Seconds since the last heartbeat of the gs:// marker `blob` (its upload if it has none)."""
    try:
        beat = float((blob.metadata or {}).get(HEARTBEAT_KEY, blob.updated.timestamp()))
    except ValueError:
        beat = blob.updated.timestamp()
    return time.time() - beat


def renew(blob, generation: int, force: bool) -> bool:
    """Patches the heartbeat of the gs:// marker `blob`, conditional on `generation` and on the
    metageneration just read; `force` False skips a beat younger than a heartbeat. False once
    the marker is not the claim's any more (published, abandoned or taken over)."""

    def ours() -> bool:
        try:
            blob.reload(retry=REQUEST_RETRY)
        except gexc.NotFound:
            return False
        return blob.generation == generation

    if not ours():
        return False
    if not force and heartbeat_age(blob) < heartbeat_seconds():
        return True
    blob.metadata = {HEARTBEAT_KEY: repr(time.time())}
    try:
        blob.patch(
            if_generation_match=generation, if_metageneration_match=blob.metageneration, retry=REQUEST_RETRY
        )
    except gexc.NotFound:
        return False
    except gexc.PreconditionFailed:
        return ours()  # taken over (lost), or another beat of this run landed first (renewed)
    return True


class KeepAlive:
    """Beats `fence` every heartbeat in a daemon thread while `active`; `check()` raises
    ClaimLost in the caller's thread once a beat found the folder taken over."""

    def __init__(self, fence: Fence, active: bool):
        self._fence, self._lost = fence, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="img2tfrecord-heartbeat", daemon=True)
        if active:
            self._thread.start()

    def _loop(self) -> None:
        missed = 0
        while not self._stop.wait(heartbeat_seconds()):
            try:
                self._fence.beat()
                missed = 0
            except ClaimLost as e:
                self._lost = e
                return
            except Exception as e:  # noqa: BLE001 - a missed beat is retried at the next one
                missed += 1
                if missed >= MISSES_TO_WARN:  # not silent: the lease lapses after LEASE_SECONDS
                    logging.warning(
                        "img2tfrecord: the claim on %s was not renewed %d times in a row (last: %s); if "
                        "this goes on for %.0f s, another run may take the folder over",
                        self._fence.output_dir,
                        missed,
                        describe(e),
                        lease_seconds(),
                    )

    def check(self) -> None:
        if self._lost is not None:
            raise self._lost

    def stop(self, wait: bool = True) -> None:
        """Stops beating and (`wait`) waits for a beat in flight (bounded by REQUEST_RETRY), so
        no beat lands after it returns."""
        self._stop.set()
        if wait and self._thread.ident is not None:  # started
            self._thread.join()


class Claim:
    """A held claim on an output folder (claim.py); `resumed` is the id of the dead run whose
    marker was taken over ('unknown' if cut short), or None; `found` the dataset files the
    folder held when it was claimed (claim.py sets it); the rest as Fence's."""

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, job: bool, generation: int | None):
        self.output_dir, self.run_id, self.resumed = output_dir, run_id, resumed
        self.job, self.generation = job, generation
        self.found: frozenset[str] | None = None

    def release(self, over: bool = False) -> None:
        """Ends the claim (publishing removed the marker). `over`: the run's job is not running
        (it finished, failed or never started), so a marker that stays has its lease ended and
        the next run takes it over at once; without it a job that may still run keeps the claim."""
        try:
            self._stop_beating()
            if over:
                Fence.of(self).expire()
        finally:
            self._close()

    def abandon(self) -> bool:
        """Ends the claim of a run that stops before publishing and whose job is not running (a
        user error, a full disk, a runner that did not start, a job that failed, a dry run).

        Its staging folder is deleted. Its marker is removed if the claim was fresh and the
        folder still holds the dataset files it held when claimed (a dataset replaced with
        --overwrite stays finished); otherwise it stays, its lease ended: the folder is
        unfinished (a dead run's leftovers, or a publish that had begun), and the next run
        takes it over at once. Returns True if publishing had begun (the folder changed).
        """
        try:
            self._stop_beating()
            delete_paths([temp_dir_for(self.output_dir, self.run_id)])
            changed = self.found is not None and self.found != _dataset_files(self.output_dir)
            if self.resumed is None and not changed:
                Fence.of(self).remove_marker()
            else:
                Fence.of(self).expire()
            return changed
        finally:
            self._close()

    def let_go(self) -> None:
        """Ends the claim without a request to its store (it does not answer): the marker and
        staging folder stay for the next run, which takes them over once the lease runs out."""
        self._stop_beating(wait=False)
        self._close()

    def _stop_beating(self, wait: bool = True) -> None:
        """Stops the heartbeat thread, if any (`wait`: for a beat in flight)."""

    def _close(self) -> None:
        """Lets go of the lock or stops the heartbeat."""


def _dataset_files(output_dir: str) -> frozenset[str]:
    return frozenset(n for n in list_children(output_dir) if is_dataset_file(n))
