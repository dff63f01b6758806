"""gs:// for every stage: one storage client, one request per call, the one retry policy.

In: gs:// paths. Out: object bytes (whole or a range, of one generation), (size, generation),
existence, listings page by page, uploads, streamed reads and writes, batch renames and
deletes. `create`, `open_read`, `exists` and `literal_or_glob` take any path (others go to
Beam's FileSystems, or os). gs:// goes through google-cloud-storage with GcsIO's client, not
Beam's gs:// filesystem, which hides a 120 s retry in every request.

Retries (transforms/retry.py): `read`, `stat` and each list page are one request with no
client retry, so the caller's RetryPolicy is the whole budget (`call`). Writes, batches and
streams apply the policy themselves (streams as its google.api_core Retry, per chunk); a
write that still fails stops the job with one line (StoreUnreachable, exit 2).

Bounds: one listing page (at most 1,000 entries) is held at a time; a batch sends 100 operations.
"""

from __future__ import annotations

import functools
import io
import operator
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import GoogleAPIError, NotFound, from_http_status
from google.auth.exceptions import GoogleAuthError

from transforms.failures import USER_ERROR_MARKER
from transforms.paths import escape_glob
from transforms.retry import DEFAULT_RETRY, GaveUp, RetryPolicy, StoreUnreachable, describe, store_of

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

# Lists `prefix` of a bucket, with the delimiter (one level) or, delimiter None, every object
# below it: yields (object name, size) and, with the delimiter, (prefix, None).
Lister = Callable[[str, "str | None"], Iterable[tuple[str, "int | None"]]]

T = TypeVar("T")


def client():
    """This process's google.cloud.storage Client (GcsIO's: Beam's credentials), one per process
    (a forked worker makes its own) and STORAGE_EMULATOR_HOST (tests change it)."""
    return _client(os.getpid(), os.environ.get("STORAGE_EMULATOR_HOST"))


@functools.lru_cache(maxsize=1)
def _client(pid: int, endpoint: str | None):
    from apache_beam.io.gcp.gcsio import GcsIO

    return GcsIO().client


def split_gcs_path(path: str) -> tuple[str, str]:
    """('bucket', 'prefix/') of a gs:// root ('' for the whole bucket); ValueError if it has no bucket."""
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
    all, or the range `start`..`end` (inclusive, either open), of `generation` if given (a
    newer one answers 404). Raises the client's errors (HTTP, or requests' for no answer)."""
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


def answers(path: str, timeout: float = 5.0) -> bool:
    """True if the store of gs:// `path` answers one request (about `path`) within `timeout`
    seconds, whatever it says (404 too); False if it fails with a transient error or not at
    all. One request, no retry: for a run's cleanup, which asks nothing of a store that is down."""
    try:
        RetryPolicy(attempts=1).call(lambda: stat(path, timeout=timeout), store_of(path))
    except NotFound:
        return True
    except (*ERRORS, StoreUnreachable) as e:
        return not isinstance(e, (GaveUp, StoreUnreachable))
    return True


def literal_or_glob(path: str) -> str:
    """The pattern for Beam's match of a path the user gave: the path itself, taken literally
    (`[`, `*`, `?` escaped) if it exists as a file or folder; otherwise `path` as a glob."""
    return escape_glob(path) if exists(path) else path


def lister(bucket: str) -> Lister:
    """A Lister of `bucket`, page by page (each one request under DEFAULT_RETRY)."""

    def list_prefix(prefix: str, delimiter: str | None) -> Iterator[tuple[str, int | None]]:
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
    """One list request: ([(name, size)...], [prefix...], next page token or None), on a fresh
    iterator each try (one that raised is finished: retrying it would end the listing early)."""
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
    return [(b.name, b.size or 0) for b in page], list(getattr(page, "prefixes", ())), blobs.next_page_token


def first_page(root: str, limit: int) -> list[str]:
    """Names of up to `limit` objects below gs:// `root`, from one list request (raises ERRORS
    if the root cannot be listed: missing bucket, no permission)."""
    bucket, prefix = split_gcs_path(root)
    objects, _, _ = call(lambda: _page(bucket, prefix, None, None, limit), root)
    return [name for name, _ in objects][:limit]


def cannot(verb: str, path: str, error: BaseException) -> StoreUnreachable:
    """The one-line error (exit 2) of a "write" to `path`, or a "read" of a file the job needs
    whole (a table, metadata), that failed for good."""
    if isinstance(error, StoreUnreachable):
        return error
    then = (
        "nothing was published, rerun when the bucket is writable"
        if verb == "write"
        else "rerun when it is reachable"
    )
    return StoreUnreachable(f"{USER_ERROR_MARKER} cannot {verb} {path}: {describe(error)}; {then}")


def upload(
    path: str,
    data: bytes,
    content_type: str = "application/octet-stream",
    policy: RetryPolicy = DEFAULT_RETRY,
) -> None:
    """Writes gs:// object `path` whole, one request per attempt under `policy`; raises
    StoreUnreachable (one line) if the write failed for good."""
    send = functools.partial(
        blob(path).upload_from_string, data, content_type=content_type, timeout=REQUEST_TIMEOUT, retry=None
    )
    try:
        call(send, path, policy)
    except ERRORS as e:
        raise cannot("write", path, e) from None


class _Stream(io.RawIOBase):
    """google-cloud-storage's BlobReader / BlobWriter (ranged requests / resumable chunks, each
    retried by the client under the policy's google.api_core Retry) with one-line failures."""

    def __init__(self, path: str, mode: str, policy: RetryPolicy, **kwargs):
        self.path, self.mode = path, mode  # mode: for Beam's CompressedFile
        self._file = blob(path).open(
            mode, chunk_size=CHUNK, timeout=REQUEST_TIMEOUT, retry=policy.as_api_retry(), **kwargs
        )

    def _do(self, method: str, *args):
        try:
            return getattr(self._file, method)(*args)
        except NotFound:
            if self.mode == "wb":
                raise cannot("write", self.path, OSError("no such bucket")) from None
            raise FileNotFoundError(f"no such object: {self.path}") from None
        except ERRORS as e:
            raise cannot("write" if self.mode == "wb" else "read", self.path, e) from None

    def readable(self) -> bool:
        return self.mode == "rb"

    seekable = readable

    def writable(self) -> bool:
        return self.mode == "wb"

    def readinto(self, buffer) -> int:  # RawIOBase builds read() and readall() on it
        data = self._do("read", len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def write(self, data) -> int:
        return self._do("write", data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._do("seek", offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                self._do("close")
            finally:
                super().close()


def _open(path: str, mode: str, compression_type: str, policy: RetryPolicy, **kwargs):
    """gs:// `path` open in `mode` through `policy`, compressed as `compression_type` (AUTO: by extension)."""
    if compression_type == CompressionTypes.AUTO:
        compression_type = CompressionTypes.detect_compression_type(path)
    raw = _Stream(path, mode, policy, **kwargs)
    if compression_type != CompressionTypes.UNCOMPRESSED:
        return CompressedFile(raw, compression_type=compression_type)
    return io.BufferedReader(raw, buffer_size=1 << 20) if mode == "rb" else raw


def open_read(
    path: str,
    mime_type: str = "application/octet-stream",
    compression_type: str = CompressionTypes.AUTO,
    policy: RetryPolicy = DEFAULT_RETRY,
):
    """`path` open for reading: gs:// through `policy`, others by FileSystems.open (same arguments)."""
    if not path.startswith(GCS_SCHEME):
        return FileSystems.open(path, mime_type=mime_type, compression_type=compression_type)
    return _open(path, "rb", compression_type, policy, raw_download=True)


def create(
    path: str,
    mime_type: str = "application/octet-stream",
    compression_type: str = CompressionTypes.UNCOMPRESSED,
    policy: RetryPolicy = DEFAULT_RETRY,
):
    """A new file at `path` open for writing: gs:// through `policy`, others by FileSystems.create."""
    if not path.startswith(GCS_SCHEME):
        return FileSystems.create(path, mime_type=mime_type, compression_type=compression_type)
    return _open(path, "wb", compression_type, policy, content_type=mime_type, ignore_flush=True)


class _Sent(Exception):
    """Leaves a batch's `with` block once it was sent (so that its exit does not send it again)."""


def _batch(
    add: Callable, items: list, name: Callable, store: str, policy: RetryPolicy, missing_ok: bool
) -> None:
    """Sends `add(client, item)` for each item deferred, BATCH_SIZE a batch request; transient
    statuses are sent again under `policy` (one batch request per attempt). Raises StoreUnreachable
    (one line, naming `name(item)`) if one failed for good (a 404 too unless `missing_ok`).
    On a client of its own: while a batch is open its client defers every call made through it."""
    from apache_beam.io.gcp.gcsio import GcsIO

    statuses = [0] * len(items)
    for first in range(0, len(items), BATCH_SIZE):
        pending = list(range(first, min(first + BATCH_SIZE, len(items))))

        def attempt() -> None:
            nonlocal pending
            own = GcsIO().client
            try:
                with own.batch(raise_exception=False) as batch:
                    for i in pending:
                        add(own, items[i])
                    responses = batch.finish(raise_exception=False)
                    raise _Sent
            except _Sent:
                pass
            for i, response in zip(pending, responses, strict=True):
                statuses[i] = response.status_code
            pending = [i for i in pending if statuses[i] in (408, 429) or statuses[i] >= 500]
            if pending:
                raise from_http_status(statuses[pending[0]], "from a batch request")

        try:
            call(attempt, store, policy)
        except ERRORS as e:
            raise cannot("write", store, e) from None
    failed = [(item, s) for item, s in zip(items, statuses) if s >= 400 and not (missing_ok and s == 404)]
    if failed:
        error = OSError(f"could not {add.__name__} {len(failed)} objects (HTTP {failed[0][1]})")
        raise cannot("write", name(failed[0][0]), error)


def delete_batch(paths: list[str], policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Deletes gs:// objects (missing ones are fine) in batch requests under `policy` (see _batch)."""

    def delete(own, path: str) -> None:
        blob(path, on=own).delete(timeout=REQUEST_TIMEOUT, retry=None)

    if paths:
        _batch(delete, paths, str, paths[0], policy, missing_ok=True)


def rename_batch(pairs: list[tuple[str, str]], policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Renames gs:// objects (copy, then delete the sources) in batch requests under `policy` (see _batch)."""

    def copy(own, pair: tuple[str, str]) -> None:
        src, dst = blob(pair[0], on=own), blob(pair[1], on=own)
        src.bucket.copy_blob(src, dst.bucket, dst.name, timeout=REQUEST_TIMEOUT, retry=None)

    if pairs:
        _batch(copy, pairs, operator.itemgetter(0), pairs[0][1], policy, missing_ok=False)
        delete_batch([src for src, _ in pairs], policy)
