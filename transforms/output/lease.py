"""The claim of a gs:// output folder: a marker created once, kept alive by a heartbeat.

In: a gs:// output folder and a run id. Out: a RemoteClaim whose KeepAlive (fence.py) refreshes
the marker's heartbeat until the claim is released, or OutputBusy / NotWritable.

Buckets have no locks, so liveness is a lease: the marker object is uploaded with
`if_generation_match=0`, the claiming process rewrites the heartbeat in its custom metadata
every HEARTBEAT_SECONDS (conditional on the marker's generation, so it stops by itself once
the marker is published, abandoned or taken over), and a marker whose heartbeat is older
than LEASE_SECONDS (by this machine's clock) is a dead run's. A takeover is an upload
conditional on the dead marker's generation: of two runs taking over together, exactly one
wins. Every request goes through transforms/gcs.py's client and the one retry policy.
"""

from __future__ import annotations

import time

from google.api_core import exceptions as gexc

from transforms import gcs
from transforms.output.fence import REQUEST_RETRY, Claim, Fence, KeepAlive, heartbeat_age
from transforms.output.marker import (
    CLAIM_TRIES,
    HEARTBEAT_KEY,
    lease_seconds,
    marker_content,
    marker_owner,
    not_writable,
    parse_marker,
)
from transforms.output.publish import MARKER_FILE, OutputBusy


class RemoteClaim(Claim):
    """A claim on a gs:// folder: the marker object at `generation`, kept alive by a thread."""

    def __init__(self, output_dir: str, run_id: str, resumed: str | None, generation: int, job: bool):
        super().__init__(output_dir, run_id, resumed, job, generation)
        self._alive = KeepAlive(Fence.of(self), active=True)

    def _close(self) -> None:
        self._alive.stop()  # no beat lands after the claim is released


def claim_remote(output_dir: str, run_id: str, job: bool = False) -> RemoteClaim:
    """Creates the marker of a gs:// folder, or takes over a dead run's (see module docstring).

    Raises:
      NotWritable: no permission, no such bucket, or the bucket does not answer.
      OutputBusy: a live run holds the folder (its heartbeat is fresh).
    """
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
            age = heartbeat_age(existing.metadata, existing.updated.timestamp(), time.time())
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
