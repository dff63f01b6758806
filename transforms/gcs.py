"""gs:// for every stage: one storage client, one request per call, the one retry policy.

In: gs:// paths. Out: object bytes (whole or a range, optionally pinned to a generation),
(size, generation), existence, listings (with the delimiter, page by page), uploads (whole
objects, or streamed with `create`), streamed reads (`open_read`), batch renames and deletes.
`create`, `open_read`, `exists` and `literal_or_glob` take any path: other schemes and local
paths go to Beam's FileSystems (or os), so callers need not branch. Everything on gs:// goes
through google-cloud-storage with Beam's credentials (GcsIO's client), one client per process
and endpoint (a batch uses one of its own: an open batch defers every call of its client).

Retries (transforms/retry.py): `read`, `stat` and each list page make one request and do not
retry (`retry=None`), with REQUEST_TIMEOUT on connecting and on each read, so the caller's
`RetryPolicy` is the whole budget (`call` wraps a request in it). Writes, batches and the
streamed reads/uploads apply it themselves (streams as the same policy in google.api_core
Retry form, per chunk); one that still fails when the budget is spent stops the job with one
line (StoreUnreachable, exit 2): a write or a table has no image to fail instead. Beam's own gs://
filesystem hides a 120 s retry inside every request (the storage client's default); nothing
here goes through it. The local emulator ignores list paging; pages are followed by their token,
so an endpoint that answers everything in one page is read the same way.

Bounds: a listing page (at most 1,000 entries) is held at a time; a batch sends 100 operations.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPIError, NotFound
from google.auth.exceptions import GoogleAuthError

from transforms.failures import USER_ERROR_MARKER
from transforms.paths import escape_glob
from transforms.retry import DEFAULT_RETRY, RetryPolicy, StoreUnreachable, describe, store_of

GCS_SCHEME = "gs://"
DELIMITER = "/"
# Seconds a request may wait to connect, and between bytes of the answer.
REQUEST_TIMEOUT = 20.0
# Operations in one batch request (GCS's limit).
BATCH_SIZE = 100
# Bytes sent or asked for in one request of a streamed upload or read (as Beam's writer).
CHUNK = 16 << 20
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


def blob(path: str, generation: int | None = None, on=None):
    """The Blob of gs:// object `path` (at `generation` if given) on client `on` (default:
    the shared one); makes no request."""
    bucket, _, name = path[len(GCS_SCHEME) :].partition("/")
    if not bucket or not name:
        raise ValueError(f"not a gs:// object path: {path}")
    return (on or client()).bucket(bucket).blob(name, generation=generation)


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
    whole = start is None and end is None  # the client checks a whole object's checksum
    return blob(path, generation).download_as_bytes(
        raw_download=True,
        start=start,
        end=end,
        timeout=timeout,
        retry=None,
        checksum="auto" if whole else None,
    )


def stat(path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, int]:
    """(size, generation) of gs:// object `path` from its metadata, in one request, no retry."""
    b = blob(path)
    b.reload(timeout=timeout, retry=None)
    return b.size, b.generation


def exists(path: str, policy: RetryPolicy = DEFAULT_RETRY) -> bool:
    """True if file or object `path` exists (local, gs:// in one request a try, other Beam filesystems)."""
    if "://" not in path:
        return os.path.exists(path)
    if not path.startswith(GCS_SCHEME):
        return FileSystems.exists(path)
    if not path[len(GCS_SCHEME) :].partition("/")[2]:
        return False  # a bucket is not a file
    try:
        call(lambda: stat(path), path, policy)
    except NotFound:
        return False
    return True


def literal_or_glob(path: str) -> str:
    """The pattern for Beam's match of a path the user gave: the path itself, taken literally
    (`[`, `*`, `?` escaped) if it exists as a file or folder; otherwise `path` as a glob."""
    return escape_glob(path) if exists(path) else path


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


class _Stream(io.RawIOBase):
    """A streamed read or upload (google-cloud-storage's BlobReader / BlobWriter: ranged
    requests / resumable chunks, each retried by the client under the policy as a google.api_core
    Retry) whose failures are one-line errors."""

    def __init__(self, path: str, mode: str, policy: RetryPolicy, **kwargs):
        self.path, self.mode = path, mode  # mode: for Beam's CompressedFile
        self._file = blob(path).open(
            mode, chunk_size=CHUNK, timeout=REQUEST_TIMEOUT, retry=policy.as_api_retry(), **kwargs
        )

    @contextlib.contextmanager
    def _one_line(self) -> Iterator[None]:
        try:
            yield
        except NotFound:
            if self.mode == "wb":
                raise cannot_write(self.path, OSError("no such bucket")) from None
            raise FileNotFoundError(f"no such object: {self.path}") from None
        except ERRORS as e:
            raise (cannot_write if self.mode == "wb" else cannot_read)(self.path, e) from None

    def readable(self) -> bool:
        return self.mode == "rb"

    def writable(self) -> bool:
        return self.mode == "wb"

    def seekable(self) -> bool:
        return self.readable()

    def read(self, size: int = -1) -> bytes:
        with self._one_line():
            return self._file.read(size)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def write(self, data) -> int:
        with self._one_line():
            return self._file.write(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._one_line():
            return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                with self._one_line():
                    self._file.close()
            finally:
                super().close()


def cannot_read(path: str, error: BaseException) -> StoreUnreachable:
    """The one-line error (exit 2) of a read of a file the job needs whole (a table, metadata)."""
    if isinstance(error, StoreUnreachable):
        return error
    return StoreUnreachable(
        f"{USER_ERROR_MARKER} cannot read {path}: {describe(error)}; rerun when it is reachable"
    )


def open_read(
    path: str,
    mime_type: str = "application/octet-stream",
    compression_type: str = CompressionTypes.AUTO,
    policy: RetryPolicy = DEFAULT_RETRY,
):
    """`path` open for reading: gs:// through the policy (see module docstring), any other path
    through Beam's FileSystems. `compression_type` as FileSystems.open's (AUTO: by extension)."""
    if not path.startswith(GCS_SCHEME):
        return FileSystems.open(path, mime_type=mime_type, compression_type=compression_type)
    if compression_type == CompressionTypes.AUTO:
        compression_type = CompressionTypes.detect_compression_type(path)
    raw = _Stream(path, "rb", policy, raw_download=True)
    if compression_type == CompressionTypes.UNCOMPRESSED:
        return io.BufferedReader(raw, buffer_size=1 << 20)
    return CompressedFile(raw, compression_type=compression_type)


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
    raw = _Stream(path, "wb", policy, content_type=mime_type, ignore_flush=True)
    if compression_type == CompressionTypes.UNCOMPRESSED:
        return raw
    return CompressedFile(raw, compression_type=compression_type)


def _batch(add: Callable[[object, object], None], items: list, path: str, policy: RetryPolicy) -> list[int]:
    """HTTP status of each deferred request `add(client, item)`, in batches of BATCH_SIZE; transient
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


def _send(add: Callable[[object, object], None], items: list) -> list:
    """One batch request of `add(client, item)` for each item: the HTTP answers, in order.

    On a client of its own: while a batch is open, its client defers every JSON API call made
    through it, so the shared client (other threads' reads) must not hold one.
    """
    from apache_beam.io.gcp.gcsio import GcsIO

    responses: list = []
    own = GcsIO().client
    try:
        with own.batch(raise_exception=False) as batch:
            for item in items:
                add(own, item)
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

    def add(own, path: str) -> None:
        blob(path, on=own).delete(timeout=REQUEST_TIMEOUT, retry=None)

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

    def add(own, pair: tuple[str, str]) -> None:
        src, dst = blob(pair[0], on=own), blob(pair[1], on=own)
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
