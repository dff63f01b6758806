"""The claim of a gs:// output folder: a marker created once, kept alive by a heartbeat.

In: a gs:// output folder and a run id. Out: a RemoteClaim whose thread refreshes the
marker's heartbeat until the claim is released, or OutputBusy / NotWritable.

Buckets have no locks, so liveness is a lease (see transforms/output/claim.py): the
marker object is uploaded with `if_generation_match=0`, the claiming process rewrites
the heartbeat in its custom metadata every HEARTBEAT_SECONDS (conditional on the
marker's generation, so it stops by itself once the marker is published, abandoned or
taken over), and a marker whose heartbeat is older than LEASE_SECONDS is a dead run's.
A takeover is an upload conditional on the dead marker's generation: of two runs taking
over together, exactly one wins. Every request goes through google-cloud-storage with
Beam's credentials (transforms/gcs.py's client) and the one bounded retry policy.
"""

from __future__ import annotations

import logging
import time

from apache_beam.io.gcp.gcsio import parse_gcs_path
from google.api_core import exceptions as gexc

from transforms import gcs
from transforms.output.marker import (
    CLAIM_TRIES,
    HEARTBEAT_KEY,
    Claim,
    NotWritable,
    heartbeat_seconds,
    heartbeat_thread,
    lease_seconds,
    marker_content,
    marker_owner,
    parse_marker,
)
from transforms.output.publish import OutputBusy
from transforms.retry import DEFAULT_RETRY

# One request's retries (503s, resets): the one retry policy's, so a claim never hangs on a
# bucket that does not answer (transforms/retry.py).
REQUEST_RETRY = DEFAULT_RETRY.as_api_retry()


def heartbeat_age(metadata: dict | None, updated_epoch: float, now: float) -> float:
    """Seconds since a marker's last heartbeat (its upload time if it has none)."""
    try:
        beat = float((metadata or {}).get(HEARTBEAT_KEY, updated_epoch))
    except ValueError:
        beat = updated_epoch
    return now - beat


def delete_marker(blob, generation: int) -> None:
    """Deletes the marker object if it is still at `generation` (the claim's own); one already
    gone or taken over is left alone."""
    try:
        blob.delete(if_generation_match=generation, retry=REQUEST_RETRY)
    except (gexc.PreconditionFailed, gexc.NotFound):
        pass


class RemoteClaim(Claim):
    """A claim on a gs:// folder: the marker object at `generation`, kept alive by a thread."""

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, blob, generation: int, job: bool):
        super().__init__(output_dir, run_id, resumed, job)
        self._blob, self.generation = blob, generation
        self._thread, self._stop = heartbeat_thread(self._beat, heartbeat_seconds())

    def _beat(self) -> bool:
        """Refreshes the heartbeat; False (stop) once the marker is no longer this claim's."""
        self._blob.metadata = {HEARTBEAT_KEY: repr(time.time())}
        try:
            self._blob.patch(if_generation_match=self.generation, retry=REQUEST_RETRY)
        except (gexc.PreconditionFailed, gexc.NotFound):
            return False  # published, abandoned or taken over
        except Exception as e:  # noqa: BLE001 - a missed beat is retried at the next one
            logging.debug("heartbeat of %s failed: %s", self.marker_path, e)
        return True

    def owns_marker(self) -> bool:
        try:
            self._blob.reload(retry=REQUEST_RETRY)
        except gexc.NotFound:
            return False
        return self._blob.generation == self.generation

    def _remove_marker(self) -> None:
        delete_marker(self._blob, self.generation)

    def _close(self) -> None:
        """Stops the heartbeat and waits for a beat in flight (bounded by REQUEST_RETRY), so no
        beat lands after the claim is released."""
        self._stop.set()
        self._thread.join()


def _upload(blob, run_id: str, generation: int, job: bool) -> None:
    blob.metadata = {HEARTBEAT_KEY: repr(time.time())}
    blob.upload_from_string(
        marker_content(run_id, job),
        content_type="application/json",
        if_generation_match=generation,
        retry=REQUEST_RETRY,
    )


def claim_remote(output_dir: str, run_id: str, client=None, job: bool = False) -> RemoteClaim:
    """Creates the marker of a gs:// folder, or takes over a dead run's (see module docstring).

    Raises:
      NotWritable: no permission, no such bucket, or the bucket does not answer.
      OutputBusy: a live run holds the folder (its heartbeat is fresh).
    """
    marker = f"{output_dir.rstrip('/')}/.img2tfrecord-in-progress.json"
    bucket_name, name = parse_gcs_path(marker)
    client = client or gcs.client()
    blob = client.bucket(bucket_name).blob(name)
    try:
        for _ in range(CLAIM_TRIES):
            try:
                _upload(blob, run_id, 0, job)
                return RemoteClaim(output_dir, run_id, None, blob, blob.generation, job)
            except gexc.PreconditionFailed:
                pass
            existing = client.bucket(bucket_name).get_blob(name, retry=REQUEST_RETRY)
            if existing is None:
                continue  # published or abandoned meanwhile
            previous = parse_marker(existing.download_as_bytes(retry=REQUEST_RETRY))
            if previous.get("run_id") == run_id:  # our own create, retried after a lost answer
                return RemoteClaim(output_dir, run_id, None, existing, existing.generation, job)
            age = heartbeat_age(existing.metadata, existing.updated.timestamp(), time.time())
            if age < lease_seconds():
                raise OutputBusy(
                    f"--output_dir {output_dir} is being written by another img2tfrecord run "
                    f"({marker_owner(previous)}, alive {age:.0f} s ago; a dead run's claim expires after "
                    f"{lease_seconds():.0f} s)"
                )
            try:
                _upload(blob, run_id, existing.generation, job)
            except gexc.PreconditionFailed:
                continue  # another run took it over first
            return RemoteClaim(
                output_dir, run_id, previous.get("run_id", "unknown"), blob, blob.generation, job
            )
    except gexc.GoogleAPICallError as e:
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise NotWritable(f"--output_dir {output_dir} is not writable: {text}") from None
    except gexc.RetryError as e:
        raise NotWritable(f"--output_dir {output_dir} is not writable: {e.cause or e}") from None
    raise OutputBusy(f"--output_dir {output_dir}: other img2tfrecord runs keep claiming it; try again")
