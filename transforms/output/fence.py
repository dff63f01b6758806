"""The claim's token, carried by the job: every change to the published folder is fenced by it.

In: the output folder, the run id and, on gs://, the marker's generation (the claim's token,
claim.py / lease.py). Out: `Fence`, a small picklable value that the graph ships to the steps
that touch the output folder, and ClaimLost (a one-line user error, exit 2) once another run
took the folder over. Two uses:

- **Fenced changes** (`with fence.held() as keep:`): publishing (moving shards, writing
  metadata, deleting stale files, removing the marker) runs inside it and calls `keep()`
  between its steps.
  - *Local folders:* the marker is opened and `flock`ed shared for the whole block and its
    content must still name this run. A claim takes the lock exclusively (claim.py), so no
    other run can take the folder over while a step is inside the block: the check and the
    change are one atomic unit.
  - *gs://:* buckets have no locks and a precondition only guards the object it writes, so
    the block renews the lease by a metadata patch conditional on the marker's generation
    (`if_generation_match`) first, and `keep()` renews it again when half a heartbeat has
    passed: a renewal that succeeds proves the marker is still this run's and keeps any other
    run from taking it over for a whole lease (LEASE_SECONDS by the claimer's clock). The
    marker itself is deleted with `if_generation_match`, so it can only remove its own.
- **A claim as long as the job** (`job`: the runner runs the steps outside the launcher,
  e.g. PortableRunner, Dataflow): the job's long-running step (WriteShards) beats the lease
  while it works (`keep_alive`), and checks the token at the start of every bundle, so a
  killed launcher does not free the folder while the job runs, and an orphaned job that lost
  the folder stops at its next beat. Local markers of such runs carry `"job": true` and their
  modification time is the heartbeat.

Beats on gs:// are conditional on the metageneration read just before
(`if_metageneration_match`), and skipped while the last beat is younger than a heartbeat, so
many workers beating together make about one write a heartbeat (GCS allows one write a
second on one object). Limits are stated in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator

from apache_beam.io.filesystems import FileSystems

from transforms.failures import USER_ERROR_MARKER
from transforms.output.claim import read_fd, same_file, share_lock
from transforms.output.marker import HEARTBEAT_KEY, Claim, heartbeat_seconds, heartbeat_thread, parse_marker
from transforms.output.publish import MARKER_FILE


class ClaimLost(RuntimeError):
    """Another run took the output folder over; this run must change nothing there."""


@dataclasses.dataclass(frozen=True)
class Fence:
    """A claim's token (see the module docstring).

    Attributes:
      output_dir: the claimed folder.
      run_id: the run that claimed it (the token of a local marker).
      generation: the gs:// marker's generation (its token); None locally.
      job: the job's steps keep the claim alive (`keep_alive`).
    """

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
            f"{USER_ERROR_MARKER} another run took over --output_dir {self.output_dir}; this run "
            f"({self.run_id}) stopped without changing it (the folder is the other run's)"
        )

    def check(self) -> None:
        """Raises ClaimLost unless the marker is still this run's."""
        with self.held():
            pass

    @contextlib.contextmanager
    def held(self) -> Iterator[Callable[[], None]]:
        """The block in which a step changes the published folder; yields `keep()`, to call
        between its steps (see the module docstring). Raises ClaimLost."""
        if self.generation is not None:
            _GcsMarker(self).renew(force=True)
            renewed = [time.monotonic()]

            def keep() -> None:
                if time.monotonic() - renewed[0] > heartbeat_seconds() / 2:
                    _GcsMarker(self).renew(force=True)
                    renewed[0] = time.monotonic()

            yield keep
            return
        try:
            fd = os.open(self.marker_path, os.O_RDONLY)
        except FileNotFoundError:
            raise self.lost() from None
        try:
            share_lock(fd)  # waits out a claim in progress (a few writes)
            if parse_marker(read_fd(fd)).get("run_id") != self.run_id or not same_file(fd, self.marker_path):
                raise self.lost()
            if self.job:
                os.utime(fd)  # the local lease's heartbeat
            yield lambda: None
        finally:
            os.close(fd)

    def beat(self) -> None:
        """Refreshes the lease if it is due (the job's steps); raises ClaimLost."""
        if self.generation is not None:
            _GcsMarker(self).renew(force=False)
        else:
            self.check()  # local: the check touches the marker of a job-kept claim

    def remove_marker(self) -> None:
        """Removes the marker if it is still this run's (the dataset is finished)."""
        if self.generation is not None:
            _GcsMarker(self).delete()
            return
        with contextlib.suppress(ClaimLost), self.held():
            os.unlink(self.marker_path)

    def keep_alive(self) -> KeepAlive:
        """A heartbeat for a step of the job (started/stopped per bundle)."""
        return KeepAlive(self)


class KeepAlive:
    """Beats a job-kept claim every heartbeat while a bundle runs; `check()` raises ClaimLost in
    the bundle's thread once a beat found the folder taken over. Inert for launcher-kept claims."""

    def __init__(self, fence: Fence):
        self._fence, self._lost = fence, None
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        if fence.job:
            fence.beat()  # at once: an orphaned job stops before writing into the folder
            self._thread, self._stop = heartbeat_thread(self._beat, heartbeat_seconds())

    def _beat(self) -> bool:
        try:
            self._fence.beat()
        except ClaimLost as e:
            self._lost = e
            return False
        except Exception:  # noqa: BLE001 - a missed beat is retried at the next one
            pass
        return True

    def check(self) -> None:
        if self._lost is not None:
            raise self._lost

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            self._stop = None


class _GcsMarker:
    """The gs:// marker object of a Fence, through google-cloud-storage (Beam's GCS client)."""

    def __init__(self, fence: Fence):
        from transforms import gcs

        self._fence = fence
        self._blob = gcs.blob(fence.marker_path)

    def renew(self, force: bool) -> None:
        """Patches the heartbeat, conditional on the generation (and the metageneration just
        read); `force` False skips a beat younger than a heartbeat. Raises ClaimLost."""
        from google.api_core import exceptions as gexc

        from transforms.output.lease import REQUEST_RETRY, heartbeat_age

        fence, blob = self._fence, self._blob

        def reload() -> None:
            try:
                blob.reload(retry=REQUEST_RETRY)
            except gexc.NotFound:
                raise fence.lost() from None
            if blob.generation != fence.generation:
                raise fence.lost()

        reload()
        if (
            not force
            and heartbeat_age(blob.metadata, blob.updated.timestamp(), time.time()) < heartbeat_seconds()
        ):
            return
        blob.metadata = {HEARTBEAT_KEY: repr(time.time())}
        try:
            blob.patch(
                if_generation_match=fence.generation,
                if_metageneration_match=blob.metageneration,
                retry=REQUEST_RETRY,
            )
        except gexc.NotFound:
            raise fence.lost() from None
        except gexc.PreconditionFailed:
            reload()  # taken over (lost), or another beat of this run landed first (renewed)

    def delete(self) -> None:
        from transforms.output.lease import delete_marker

        delete_marker(self._blob, self._fence.generation)
