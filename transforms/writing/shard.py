"""Writing one shard: read, check and encode its images in plan order into a temp TFRecord file.

`write_shard` is the whole job of one ShardTask as a plain function, so that WriteShardFn
can run it in its own thread (Dataflow, remote runners, `--write_processes 1`) or hand it
to a worker process (transforms/writing/processes.py), which then needs nothing but the
task's paths and labels. `ShardFile` frames the records itself and writes them to a plain
buffered file (local, uncompressed) or through Beam's FileSystems (gzip, gs://): the same
bytes as the writer of Beam's `_TFRecordSink`, without its per-record layers (see
tests/writing/test_write_processes.py).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.encoding.encoder import EncodeSettings, encode_image_chunks
from transforms.encoding.tfrecord import RECORD_OVERHEAD, frame_chunks
from transforms.failures import Failure
from transforms.images.limits import check_header
from transforms.images.prefetch import map_in_order
from transforms.images.read import ReadError, read_bytes, read_open, read_with_retries
from transforms.images.types import ImageError, ImageInfo
from transforms.listing.members import parse_address
from transforms.records import ClassIndex, ImageRecord, ShardResult, ShardTask
from transforms.retry import DEFAULT_RETRY, RetryPolicy
from transforms.testhooks import PAUSE_ENV, pause_if_asked
from transforms.writing.files import delete_paths
from transforms.writing.index import write_index

COMPRESSIONS = {"none": CompressionTypes.UNCOMPRESSED, "gzip": CompressionTypes.GZIP}
# Records of a local shard are written in batches of about this many bytes, one writev each.
_BUFFER_BYTES = 1 << 20
_IOV_MAX = 512  # buffers per writev call (Linux and macOS allow 1024)


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


class ShardFile:
    """A TFRecord file being written (a context manager; `close` ends it).

    Byte for byte what `_TFRecordSink.open_writer` writes. A local uncompressed shard
    collects each record's header, chunks (see `serialize_example_chunks`) and footer and
    writes about a megabyte of records with one `os.writev`, so the image bytes are copied
    once, by the kernel, from the object they were read into. Gzip and remote shards go
    through `transforms.gcs.create` (gs:// under the one retry policy, others through Beam's
    FileSystems), one write per framed record as the sink does.
    """

    def __init__(self, path: str, compression: str = "none"):
        self.path = path
        self._buffers: list[bytes] = []  # header, chunks and footer of the records not yet written
        self._pending = 0  # their bytes
        self._fd = -1
        self._file = None
        if compression == "none" and "://" not in path and hasattr(os, "writev"):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666
            )
        else:
            self._file = gcs.create(path, compression_type=COMPRESSIONS[compression])

    def write(self, data: bytes) -> None:
        self.write_chunks((data,), len(data))

    def write_chunks(self, chunks: Sequence[bytes], size: int) -> None:
        """Appends the record `b"".join(chunks)` (`size` bytes), without joining it."""
        header, footer = frame_chunks(chunks, size)
        if self._file is not None:
            self._file.write(b"".join((header, *chunks, footer)))
            return
        self._buffers += (header, *chunks, footer)
        self._pending += size + RECORD_OVERHEAD
        if self._pending >= _BUFFER_BYTES or len(self._buffers) >= _IOV_MAX:
            self._flush()

    def _flush(self) -> None:
        """Writes the pending buffers in order, in as many writev calls as it takes."""
        buffers, self._buffers, self._pending = self._buffers, [], 0
        i = 0
        while i < len(buffers):
            start = i
            written = os.writev(self._fd, buffers[i : i + _IOV_MAX])
            while i < len(buffers) and written >= len(buffers[i]):
                written -= len(buffers[i])
                i += 1
            if written:  # a short write ends inside buffers[i]
                buffers[i] = memoryview(buffers[i])[written:]
            elif i == start:
                raise OSError(f"{self.path}: nothing written")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            return
        if self._fd < 0:
            return
        try:
            self._flush()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """How every shard of a run is written. Small and picklable: it goes to worker processes.

    Attributes:
      temp_dir: the run's temp folder; shards go to `<temp_dir>/<split>/`.
      compression: 'none' or 'gzip'.
      settings: how images are checked, converted and encoded.
      write_index: also write `<shard>.idx` (uncompressed shards only).
      reader, retry: how an image's bytes are read (transient errors retried).
    """

    temp_dir: str
    compression: str = "none"
    settings: EncodeSettings = EncodeSettings()
    write_index: bool = False
    reader: Callable[[str], bytes] = read_bytes
    retry: RetryPolicy = DEFAULT_RETRY

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}")
        if self.write_index and self.compression != "none":
            raise ValueError("index files exist for uncompressed shards only")

    def temp_path(self, task: ShardTask) -> str:
        """A fresh temp path; the shard number leads the name, so temp paths sort in plan order."""
        name = f"{task.index:05d}-{uuid.uuid4().hex}.{task.split}{shard_suffix(self.compression)}"
        return FileSystems.join(self.temp_dir, task.split, name)


@dataclasses.dataclass(frozen=True)
class ShardOutcome:
    """What writing one ShardTask (or part of one) gave.

    Attributes:
      result: the temp shard written, or None if no image was written.
      failures: the images that could not be read or decoded.
      sizes: the data bytes of each written record, in order (for the index of joined parts).
    """

    result: ShardResult | None
    failures: tuple[Failure, ...]
    sizes: tuple[int, ...] = ()


def write_shard(
    task: ShardTask,
    class_index: ClassIndex,
    job: ShardJob,
    pool: ThreadPoolExecutor | None = None,
    on_written: Callable[[int], None] | None = None,
    whole: bool = True,
    reads_only: bool = False,
    hint_ahead: int = 0,
) -> ShardOutcome:
    """Reads, checks and encodes `task`'s images in order and writes them to a temp shard.

    Images that cannot be read or decoded become Failures (stages 'read' and 'decode'); any
    other exception is a bug and propagates. `pool` reads, checks and encodes the next
    images ahead (see transforms/images/prefetch.py) or, with `reads_only`, only reads them (the
    rest holds the GIL: done in this thread, it costs no hand-over). `on_written(nbytes)` is
    called after each written image. `hint_ahead` > 0 asks the kernel to read that many
    local files ahead (`OpenAhead`, or `will_need` for a custom reader). With `whole` False the task is one part of a shard
    (see `split_shards`): its index file, if any, is written by `join_parts`.
    """
    settings, reader, retry = job.settings, job.reader, job.retry
    # Large files are checked from their first bytes before being read whole (transforms/images/limits.py).
    check = functools.partial(check_header, max_pixels=settings.max_pixels)
    if reader is read_bytes:
        reader = functools.partial(read_bytes, check=check)

    def read(record: ImageRecord) -> bytes:
        return read_with_retries(record.path, reader, retry)

    def load(record: ImageRecord) -> tuple[list[bytes], ImageInfo]:
        return encode_image_chunks(record, read(record), class_index, settings)

    def encode_after(
        record: ImageRecord, data: Callable[[], bytes]
    ) -> Callable[[], tuple[list[bytes], ImageInfo]]:
        return lambda: encode_image_chunks(record, data(), class_index, settings)

    # The records are built from the task's columns as they are consumed: a part holds up
    # to PART_RECORDS of them (processes.py), a shard written whole up to --max_records_per_shard.
    records = task.iter_records()
    paths = task.batch.paths
    # Read here, by read_bytes: each file is opened once, `hint_ahead` images early (OpenAhead).
    opened = OpenAhead(
        paths, hint_ahead if pool is None and job.reader is read_bytes and not reads_only else 0
    )

    def load_opened(i: int, record: ImageRecord) -> tuple[list[bytes], ImageInfo]:
        fd = opened.take(i)
        if fd is None:
            return load(record)
        try:
            data = read_open(fd, check)
        except ReadError:
            raise
        except OSError:  # transient: read again from the path, with the usual retries
            data = read(record)
        return encode_image_chunks(record, data, class_index, settings)

    if reads_only:
        loaded = ((r, encode_after(r, data)) for r, data in map_in_order(read, records, pool))
    elif opened.ahead:
        loaded = ((r, functools.partial(load_opened, i, r)) for i, r in enumerate(records))
    else:
        loaded = map_in_order(load, records, pool)
    hint_ahead = 0 if opened.ahead else hint_ahead
    failures: list[Failure] = []
    sizes: list[int] = []
    formats: set[str] = set()
    per_class: collections.Counter = collections.Counter()
    for path in paths[:hint_ahead]:
        will_need(path)
    paused = PAUSE_ENV in os.environ  # the test hook (looked up once, not per image)
    with ShardFile(job.temp_path(task), job.compression) as shard, opened:
        for i, (record, result) in enumerate(loaded):
            if hint_ahead and i + hint_ahead < len(paths):
                will_need(paths[i + hint_ahead])
            try:
                chunks, info = result()
            except ImageError as e:
                failures.append(_failure(record, str(e), "decode"))
                continue
            except OSError as e:  # missing, unreadable, permission denied, transient I/O
                failures.append(_failure(record, f"unreadable: {e}", "read"))
                continue
            size = sum(map(len, chunks))
            shard.write_chunks(chunks, size)
            sizes.append(size)
            formats.add(info.format)  # as stored, after any conversion
            per_class[(record.split, record.class_key)] += 1
            if on_written is not None:
                on_written(size)
            if paused:
                pause_if_asked("write_shard")
    if not sizes:
        delete_paths([shard.path])
        return ShardOutcome(None, tuple(failures))
    if job.write_index and whole:
        write_index(shard.path, sizes)
    result = ShardResult(
        task.split,
        task.index,
        shard.path,
        len(sizes),
        sum(sizes),
        tuple(sorted(formats)),
        tuple(sorted(per_class.items())),
    )
    return ShardOutcome(result, tuple(failures), tuple(sizes))


def will_need(path: str) -> None:
    """Asks the kernel to start reading a local file into the page cache; never blocks or fails."""
    fd = open_hinted(path)
    if fd is not None:
        os.close(fd)


def open_hinted(path: str) -> int | None:
    """A local file opened after asking the kernel to read it into the page cache, or None.

    Opened non-blocking (a FIFO must not hang here); None for a remote path or when the
    file cannot be opened: any error is left for the real read to report. For an archive
    member's address only the member's bytes are hinted, and None is returned.
    """
    if "://" in path or not hasattr(os, "posix_fadvise"):
        return None
    address = parse_address(path)
    try:
        fd = os.open(path if address is None else address.source, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if address is None:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        else:  # an archive member: hint its bytes only; the read opens the archive itself
            os.posix_fadvise(fd, address.offset, address.size, os.POSIX_FADV_WILLNEED)
            os.close(fd)
            return None
    except OSError:
        pass
    return fd


class OpenAhead:
    """The files of a shard opened `ahead` images before they are read (`open_hinted`).

    The kernel reads them in while earlier images are checked and written (a cold disk
    then serves several reads at once), and the read uses the open descriptor: one open
    and one close a file. A context manager: leaving it closes what was not read.
    """

    def __init__(self, paths: Sequence[str], ahead: int):
        self.ahead = ahead
        self._paths = paths if ahead else ()
        self._fds: dict[int, int] = {}  # record index -> descriptor
        self._next = 0  # the next record to open

    def take(self, i: int) -> int | None:
        """The descriptor of record `i` (the caller closes it), or None; opens the next ones."""
        last = min(i + self.ahead + 1, len(self._paths))
        while self._next < last:
            fd = open_hinted(self._paths[self._next])
            if fd is not None:
                self._fds[self._next] = fd
            self._next += 1
        return self._fds.pop(i, None)

    def __enter__(self) -> OpenAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def can_split(job: ShardJob) -> bool:
    """True if a shard may be written in parts and joined: local and uncompressed.

    A TFRecord file is its records one after the other, so the parts of an uncompressed
    shard appended in order are byte for byte the shard written whole. (Gzip members
    would not be, and objects in a bucket cannot be appended to.)
    """
    return job.compression == "none" and "://" not in job.temp_dir


def split_shards(tasks: list[ShardTask], workers: int) -> list[list[ShardTask]]:
    """The order in which `workers` processes write `tasks`, each as a list of its parts.

    Largest shards first, so that the small ones fill in at the end; the last `workers`
    shards are cut into `workers` parts each, so that no process idles while another
    writes a whole last shard alone (with 2 workers and 5 equal shards, the fifth
    would otherwise take a fifth of the time on one core).
    """
    ordered = sorted(tasks, key=lambda t: -sum(t.batch.sizes))
    plan = [[task] for task in ordered]
    for i in range(max(0, len(plan) - workers), len(plan) if workers > 1 else 0):
        task = plan[i][0]
        n = len(task)
        bounds = [n * k // workers for k in range(workers + 1)]
        parts = [task.part(a, b) for a, b in zip(bounds, bounds[1:])]
        plan[i] = [p for p in parts if len(p)] or [task]
    return plan


def join_parts(parts: list[ShardOutcome], job: ShardJob) -> ShardOutcome:
    """One shard from the outcomes of its parts, in order: the part files appended to the first."""
    failures = tuple(f for p in parts for f in p.failures)
    sizes = tuple(s for p in parts for s in p.sizes)
    written = [p.result for p in parts if p.result is not None]
    if not written:
        return ShardOutcome(None, failures)
    first = written[0]
    with open(first.temp_path, "r+b", buffering=0) as out:
        out.seek(0, os.SEEK_END)
        for part in written[1:]:
            with open(part.temp_path, "rb") as src:
                _copy(src, out, os.fstat(src.fileno()).st_size)
    delete_paths([p.temp_path for p in written[1:]])
    if job.write_index:
        write_index(first.temp_path, sizes)
    result = dataclasses.replace(
        first,
        records=sum(r.records for r in written),
        bytes=sum(r.bytes for r in written),
        formats=tuple(sorted({f for r in written for f in r.formats})),
        written=tuple(sorted(written_counts(written).items())),
    )
    return ShardOutcome(result, failures, sizes)


def written_counts(shards: Iterable[ShardResult]) -> dict[tuple[str, str], int]:
    """Images written per (split, class_key), summed over the shards' own counts."""
    written: collections.Counter = collections.Counter()
    for shard in shards:
        for key, n in shard.written:
            written[key] += n
    return dict(written)


def _copy(src: BinaryIO, dst: BinaryIO, size: int) -> None:
    """Appends `size` bytes of `src` at `dst`'s position, inside the kernel where it can."""
    if not hasattr(os, "copy_file_range"):
        shutil.copyfileobj(src, dst)
        return
    dst.flush()
    while size > 0:
        copied = os.copy_file_range(src.fileno(), dst.fileno(), size)
        if copied == 0:
            raise OSError(f"{src.name} ended early while being joined to {dst.name}")
        size -= copied


def _failure(record: ImageRecord, reason: str, stage: str) -> Failure:
    return Failure(record.path, reason, stage, record.split, record.class_key)
