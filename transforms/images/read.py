"""Reading one image file: regular files only, transient errors retried with backoff.

In: a local, gs:// or other Beam filesystem path, or an archive member's address
(`<archive>#<member>@<offset>+<size>`, listing/members.py), read as that range of the archive.
Out: its bytes, or a ReadError whose message is the reason written to failures.jsonl. A store
that answers nothing but transient errors for long stops the job (retry.StoreUnreachable).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import stat
import time
from collections.abc import Callable
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.api_core.exceptions import RequestRangeNotSatisfiable

from transforms import gcs
from transforms.listing.members import BLOCK, MemberAddress, header_holds, parse_address
from transforms.retry import (
    DEFAULT_RETRY,
    TRANSIENT_ERRNOS,
    GaveUp,
    RetryPolicy,
    describe,
    http_status,
    store_of,
)

# Files above this size have their first HEADER_BYTES checked (a `HeaderCheck`, e.g.
# limits.check_header) before they are read whole; smaller ones are read at once.
CHECK_ABOVE = 64 << 20
HEADER_BYTES = 256 << 10

# (first bytes, file size) -> None; raises (an ImageError) to refuse a file without reading it.
HeaderCheck = Callable[[bytes, int], None]


class ReadError(OSError):
    """The file could not be read; the message is the reason (one line)."""


def open_local(path: str) -> int:
    """A non-blocking descriptor of `path` for `read_open`: a FIFO swapped in after listing is
    refused by fstat, never waited on. Raises ReadError (or a transient OSError)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ReadError(f"broken symbolic link to {os.readlink(path)!r}") from None
        raise ReadError("file disappeared after listing (no such file)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ReadError("symbolic link loop") from None
        if e.errno in TRANSIENT_ERRNOS:
            raise
        raise ReadError(e.strerror or str(e)) from None


def _regular_size(fd: int) -> int:
    """The size of the file open as `fd`. Raises ReadError if it is not a regular file."""
    mode, size = (info := os.fstat(fd)).st_mode, info.st_size
    if not stat.S_ISREG(mode):
        kind = "directory" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode) else "special file"
        raise ReadError(f"not a regular file ({kind})")
    return size


def read_open(fd: int, check: HeaderCheck | None = None) -> bytes:
    """All bytes of the regular file open (non-blocking) as `fd`, which is closed. A file above
    CHECK_ABOVE bytes is read whole only if `check(first HEADER_BYTES, size)` accepts it.

    Raises:
      ReadError: not a regular file. A transient OSError propagates.
    """
    try:
        size = _regular_size(fd)
        if check is not None and size > CHECK_ABOVE:
            check(os.pread(fd, HEADER_BYTES, 0), size)
        # One read of the known size + 1 (4 system calls a file instead of ~11 through a
        # buffered file object); a file that grew, or a short read, is read on to its end.
        try:
            first = os.read(fd, size + 1)
            if len(first) == size:
                return first
            chunks = [first]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        except MemoryError:  # the allocation failed: nothing is half-done, the worker goes on
            raise ReadError(f"a {size:,}-byte file does not fit in memory") from None
    finally:
        os.close(fd)


def read_remote(path: str, check: HeaderCheck | None = None) -> bytes:
    """All bytes of a gs:// (or other Beam filesystem) object; `check` as in `read_open`."""
    if path.startswith("gs://"):
        return gcs.read(path) if check is None else read_gcs_checked(path, check)
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        if check is not None and f.seekable():
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            if size > CHECK_ABOVE:
                check(f.read(HEADER_BYTES), size)
                f.seek(0)
        try:
            return f.read()
        except MemoryError:
            raise ReadError("the object does not fit in memory") from None


def read_bytes(path: str, check: HeaderCheck | None = None) -> bytes:
    """All bytes of `path`, local or on any Beam filesystem, or of the archive member it
    addresses; `check` as in `read_open` (for a member: on its own size)."""
    address = parse_address(path)
    if address is None:
        return read_remote(path, check) if "://" in path else read_open(open_local(path), check)
    read_member = read_member_remote if "://" in address.source else read_member_local
    try:
        if check is not None and address.size > CHECK_ABOVE:
            check(read_member(dataclasses.replace(address, size=HEADER_BYTES)), address.size)
        return read_member(address)
    except MemoryError:
        raise ReadError("the archive member does not fit in memory") from None


def read_gcs_checked(path: str, check: HeaderCheck) -> bytes:
    """All bytes of gs:// object `path`: one request of CHECK_ABOVE bytes, which holds a small
    object whole; a larger one is read on only if `check(header, size from its metadata)` passes."""
    try:
        head = gcs.read(path, end=CHECK_ABOVE - 1)
    except RequestRangeNotSatisfiable:  # an empty object has no byte range
        return gcs.read(path)
    if len(head) < CHECK_ABOVE:
        return head
    size, _ = gcs.stat(path)
    if size <= CHECK_ABOVE:
        return head
    check(head[:HEADER_BYTES], size)
    try:
        return head + gcs.read(path, start=CHECK_ABOVE)
    except MemoryError:
        raise ReadError("the object does not fit in memory") from None


def open_source(path: str) -> BinaryIO:
    """`path` open for a streaming read: a local regular file, any Beam filesystem, or an
    archive member's bytes. Raises OSError (ReadError: not a regular file)."""
    if parse_address(path) is not None:
        return io.BytesIO(read_bytes(path))  # one member: bounded by the largest image
    if "://" in path:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    fd = open_local(path)
    try:
        _regular_size(fd)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_with_retries(
    path: str,
    reader: Callable[[str], bytes] = read_bytes,
    policy: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """Reads `path`, retrying transient errors under `policy` (transforms/retry.py).

    Raises:
      ReadError: the file cannot be read (at once for permanent errors, after
        `policy.attempts` tries or `policy.deadline` seconds for transient ones).
      StoreUnreachable: the file's store has answered nothing but transient errors for
        `policy.store_down` seconds (this file's and others').
    """
    try:
        return policy.call(lambda: reader(path), store_of(path), sleep)
    except ReadError:
        raise
    except Exception as e:
        if isinstance(e, OSError) or http_status(e) is not None:  # GaveUp is an OSError
            raise ReadError(str(e) if isinstance(e, GaveUp) else describe(e)) from None
        raise  # not an I/O error at all: a bug


# Archive members: one positioned read of the archive file (listing/members.py has the address).
CHANGED = "archive changed since it was listed"


def read_member_local(address: MemberAddress) -> bytes:
    """The member's bytes from a local archive (one positioned read, with its header block when
    the address pins it). Raises ReadError: the archive is gone, not a regular file, ends before
    the member does, or no longer holds the member's header there (CHANGED)."""
    start = address.offset - (BLOCK if address.header is not None else 0)
    fd = open_local(address.source)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReadError("archive is not a regular file")
        chunks, got, size = [], 0, address.offset + address.size - start
        while got < size:  # fewer bytes only at the archive's end
            chunk = os.pread(fd, size - got, start + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    return _member(b"".join(chunks), address)


def read_member_remote(address: MemberAddress) -> bytes:
    """The member's bytes from an archive on gs:// (one ranged GET, of the generation listed)
    or another Beam filesystem, its header checked as in read_member_local."""
    start = address.offset - (BLOCK if address.header is not None else 0)
    if start == address.offset + address.size:
        return b""
    if address.source.startswith("gs://"):
        from google.api_core.exceptions import NotFound

        end = address.offset + address.size - 1  # one request; the RetryPolicy retries it
        try:
            data = gcs.read(address.source, start=start, end=end, generation=address.generation)
        except NotFound:
            if address.generation is None:
                raise
            raise ReadError(f"{CHANGED} (generation {address.generation} is gone)") from None
    else:
        with FileSystems.open(address.source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.seek(start)
            data = f.read(address.offset + address.size - start)
    return _member(data, address)


def _member(data: bytes, address: MemberAddress) -> bytes:
    """The member's bytes out of those read: its header block if pinned (and the one listed),
    then all of its data."""
    if address.header is not None:
        if not header_holds(data[:BLOCK], address):
            raise ReadError(
                f"{CHANGED}: the member's header at byte {address.offset - BLOCK} is not the one listed"
            )
        data = data[BLOCK:]
    if len(data) != address.size:
        raise ReadError(
            f"archive truncated: {len(data)} of the member's {address.size} bytes at byte {address.offset}"
        )
    return data
