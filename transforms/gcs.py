"""gs:// for every stage: one storage client, one request per call, the one retry policy.

In: gs:// paths. Out: object bytes (whole or a range, optionally pinned to a generation), sizes
and generations, listings (with the delimiter), uploads (whole objects or a streamed writer),
and batch copies/deletes. Everything goes through google-cloud-storage with Beam's credentials
(GcsIO's client), one client per process and endpoint.

Retries: the functions here make one request and do not retry (`retry=None`), with a
REQUEST_TIMEOUT on connecting and on each read, so the caller's `RetryPolicy`
(transforms/retry.py) is the whole budget: `call` wraps them in it. Writes use it themselves:
an upload or batch that still fails when the budget is spent stops the job with one line
(StoreUnreachable, exit 2) — a write has no image to fail instead. The streamed writer's
chunks are retried by the client with the same policy as a google.api_core Retry.
Beam's own gs:// filesystem hides a 120 s retry inside every request (the storage client's
default); nothing here goes through it.
"""

from __future__ import annotations

import functools
import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPIError
from google.auth.exceptions import GoogleAuthError

from transforms.failures import USER_ERROR_MARKER
from transforms.retry import DEFAULT_RETRY, RetryPolicy, StoreUnreachable, describe, store_of

GCS_SCHEME = "gs://"
DELIMITER = "/"
# Seconds a request may wait to connect, and between bytes of the answer.
REQUEST_TIMEOUT = 20.0
# Operations in one batch request (GCS's limit).
BATCH_SIZE = 100
# Bytes sent in one request of a streamed upload (Beam's writer uses the same).
UPLOAD_CHUNK = 16 << 20
# What a request may raise once its retries are spent (requests' errors are OSErrors).
ERRORS = (GoogleAPIError, GoogleAuthError, OSError)

# (object name, size) or (prefix, None): one entry of a listing with the delimiter.
Entry = tuple[str, "int | None"]
# Lists `prefix` of a bucket: with the delimiter (objects and prefixes of one level) or,
# delimiter None, every object below it. Yields Entries.
Lister = Callable[[str, "str | None"], Iterable[Entry]]

T = TypeVar("T")

# One storage client per process (a forked worker makes its own) and endpoint (tests point
# STORAGE_EMULATOR_HOST at local servers one after another in one process).
_clients: dict[tuple[int, str | None], object] = {}
_clients_lock = threading.Lock()


def client():
    """This process's google.cloud.storage Client, with Beam's credentials and settings."""
    key = (os.getpid(), os.environ.get("STORAGE_EMULATOR_HOST"))
    with _clients_lock:
        if key not in _clients:
            from apache_beam.io.gcp.gcsio import GcsIO

            _clients.clear()
            _clients[key] = GcsIO().client
        return _clients[key]


def split_gcs_path(path: str) -> tuple[str, str]:
    """('bucket', 'prefix/') of a gs:// root; the prefix is '' for the whole bucket.

    Raises:
      ValueError: not a gs:// path, or no bucket name.
    """
    if not path.startswith(GCS_SCHEME):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len(GCS_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket name in {path}")
    name = name.rstrip("/")
    return bucket, (name + "/" if name else "")


def blob(path: str, generation: int | None = None):
    """The Blob of gs:// object `path` (at `generation` if given); makes no request."""
    bucket, _, name = path[len(GCS_SCHEME) :].partition("/")
    if not bucket or not name:
        raise ValueError(f"not a gs:// object path: {path}")
    return client().bucket(bucket).blob(name, generation=generation)


def call(fn: Callable[[], T], path: str, policy: RetryPolicy = DEFAULT_RETRY) -> T:
    """`fn()` (one request about `path`) under `policy`; see RetryPolicy.call."""
    return policy.call(fn, store_of(path))


def read(
    path: str,
    start: int | None = None,
    end: int | None = None,
    generation: int | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> bytes:
    """The bytes of gs:// object `path` as stored (no transcoding), in one request, no retry:
    all of them, or the range `start`..`end` (inclusive, either open). With `generation`,
    that generation of the object only (a newer one answers 404).

    Raises:
      google.api_core.exceptions.GoogleAPICallError: the answer was an HTTP error.
      requests.exceptions.RequestException: no answer (refused, reset, timed out).
    """
    return blob(path, generation).download_as_bytes(
        raw_download=True, start=start, end=end, timeout=timeout, retry=None, checksum=None
    )


def stat(path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, int]:
    """(size, generation) of gs:// object `path` from its metadata, in one request, no retry."""
    b = blob(path)
    b.reload(timeout=timeout, retry=None)
    return b.size, b.generation


def lister(bucket: str) -> Lister:
    """A Lister of `bucket`: paged, streamed page by page, each page one request under DEFAULT_RETRY.

    Pages are followed by their token; an endpoint that ignores paging (the local emulator)
    answers everything in one page, which is read the same way.
    """

    def list_prefix(prefix: str, delimiter: str | None) -> Iterator[Entry]:
        token = None
        while True:
            objects, prefixes, token = call(
                functools.partial(_page, bucket, prefix, delimiter, token), f"{GCS_SCHEME}{bucket}"
            )
            yield from objects
            yield from ((sub, None) for sub in prefixes)
            if not token:
                return

    return list_prefix


def _page(bucket: str, prefix: str, delimiter: str | None, token: str | None, limit: int | None = None):
    """One list request: ([(name, size)...], [prefix...], next page token or None).

    A page is asked for by its token on a fresh iterator, so a failed request is simply made
    again (a page iterator that raised is finished: retrying it would end the listing early).
    """
    blobs = client().list_blobs(
        bucket,
        prefix=prefix or None,
        delimiter=delimiter,
        page_token=token,
        max_results=limit,
        timeout=REQUEST_TIMEOUT,
        retry=None,
    )
    page = next(blobs.pages, None)
    if page is None:
        return [], [], None
    # An object's size is never None; a prefix's is.
    objects = [(b.name, b.size or 0) for b in page]
    return objects, list(getattr(page, "prefixes", ())), blobs.next_page_token


def first_page(root: str, limit: int) -> list[str]:
    """Names of up to `limit` objects below gs:// `root`, from a single list request.

    Raises:
      ERRORS: the root cannot be listed (missing bucket, no permission).
    """
    bucket, prefix = split_gcs_path(root)
    objects, _, _ = call(lambda: _page(bucket, prefix, None, None, limit), root)
    return [name for name, _ in objects][:limit]


def cannot_write(path: str, error: BaseException) -> StoreUnreachable:
    """The one-line error (exit 2) of a write to `path` that failed for good."""
    if isinstance(error, StoreUnreachable):
        return error
    return StoreUnreachable(
        f"{USER_ERROR_MARKER} cannot write {path}: {describe(error)}; nothing was published, "
        "rerun when the bucket is writable"
    )


def upload(
    path: str,
    data: bytes,
    content_type: str = "application/octet-stream",
    policy: RetryPolicy = DEFAULT_RETRY,
) -> None:
    """Writes gs:// object `path` whole, one request per attempt under `policy`.

    Raises:
      StoreUnreachable: the write failed for good (one line).
    """
    b = blob(path)
    try:
        call(
            lambda: b.upload_from_string(
                data, content_type=content_type, timeout=REQUEST_TIMEOUT, retry=None
            ),
            path,
            policy,
        )
    except ERRORS as e:
        raise cannot_write(path, e) from None


class _Writer(io.RawIOBase):
    """A streamed upload (google-cloud-storage's BlobWriter) whose failures are one-line errors."""

    mode = "wb"  # for Beam's CompressedFile

    def __init__(self, path: str, content_type: str, policy: RetryPolicy):
        self.path = path
        self._file = blob(path).open(
            "wb",
            chunk_size=UPLOAD_CHUNK,
            ignore_flush=True,
            content_type=content_type,
            timeout=REQUEST_TIMEOUT,
            retry=policy.as_api_retry(),
        )

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._file.tell()

    def write(self, data) -> int:
        try:
            return self._file.write(data)
        except ERRORS as e:
            raise cannot_write(self.path, e) from None

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            except ERRORS as e:
                raise cannot_write(self.path, e) from None
            finally:
                super().close()


def create(
    path: str,
    mime_type: str = "application/octet-stream",
    compression_type: str = CompressionTypes.UNCOMPRESSED,
    policy: RetryPolicy = DEFAULT_RETRY,
):
    """A new file at `path` open for writing: gs:// through the policy (see module docstring),
    any other path through Beam's FileSystems. `compression_type` as FileSystems.create's."""
    if not path.startswith(GCS_SCHEME):
        return FileSystems.create(path, mime_type=mime_type, compression_type=compression_type)
    if compression_type == CompressionTypes.AUTO:
        compression_type = CompressionTypes.detect_compression_type(path)
    raw = _Writer(path, mime_type, policy)
    if compression_type == CompressionTypes.UNCOMPRESSED:
        return raw
    return CompressedFile(raw, compression_type=compression_type)


def _batch(add: Callable[[object], None], items: list, path: str, policy: RetryPolicy) -> list[int]:
    """HTTP status of each deferred request `add(item)`, in batches of BATCH_SIZE; transient
    statuses are sent again under `policy` (one batch request per attempt)."""
    statuses = [0] * len(items)
    for first in range(0, len(items), BATCH_SIZE):
        pending = list(range(first, min(first + BATCH_SIZE, len(items))))

        def attempt() -> None:
            nonlocal pending
            responses = _send(add, [items[i] for i in pending])
            for i, response in zip(pending, responses, strict=True):
                statuses[i] = response.status_code
            pending = [i for i in pending if statuses[i] in (408, 429) or statuses[i] >= 500]
            if pending:
                raise _BatchStatus(statuses[pending[0]])

        try:
            call(attempt, path, policy)
        except ERRORS as e:
            raise cannot_write(path, e) from None
    return statuses


class _BatchStatus(Exception):
    """Some operations of a batch answered a transient status (`code`, for is_transient)."""

    def __init__(self, code: int):
        super().__init__(f"HTTP {code}")
        self.code = code


class _Sent(Exception):
    """Leaves a batch's `with` block once it was sent (so it is not sent again)."""


def _send(add: Callable[[object], None], items: list) -> list:
    responses: list = []
    try:
        with client().batch(raise_exception=False) as batch:
            for item in items:
                add(item)
            responses = batch.finish(raise_exception=False)
            raise _Sent
    except _Sent:
        pass
    return responses


def delete_batch(paths: list[str], policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Deletes gs:// objects (missing ones are fine), in batch requests under `policy`.

    Raises:
      StoreUnreachable: an object could not be deleted (one line).
    """

    def add(path: str) -> None:
        blob(path).delete(timeout=REQUEST_TIMEOUT, retry=None)

    statuses = _batch(add, paths, paths[0] if paths else "", policy) if paths else []
    failed = [(p, s) for p, s in zip(paths, statuses, strict=True) if s >= 400 and s != 404]
    if failed:
        raise cannot_write(
            failed[0][0], OSError(f"could not delete {len(failed)} objects (HTTP {failed[0][1]})")
        )


def rename_batch(pairs: list[tuple[str, str]], policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Renames gs:// objects (copy, then delete the sources), in batch requests under `policy`.

    Raises:
      StoreUnreachable: an object could not be copied or deleted (one line).
    """

    def add(pair: tuple[str, str]) -> None:
        src, dst = blob(pair[0]), blob(pair[1])
        src.bucket.copy_blob(src, dst.bucket, dst.name, timeout=REQUEST_TIMEOUT, retry=None)

    if not pairs:
        return
    statuses = _batch(add, pairs, pairs[0][1], policy)
    failed = [(src, s) for (src, _), s in zip(pairs, statuses, strict=True) if s >= 400]
    if failed:
        raise cannot_write(
            failed[0][0], OSError(f"could not copy {len(failed)} objects (HTTP {failed[0][1]})")
        )
    delete_batch([src for src, _ in pairs], policy)
