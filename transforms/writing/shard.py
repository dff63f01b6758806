"""Writing one shard: read, check and encode its images in plan order into a temp TFRecord file.

`write_shard` is the whole job of one ShardTask as a plain function, run by WriteShardFn's own
thread (remote runners, `--write_processes 1`) or by a worker process (processes.py).
`ShardFile` frames the records itself: the same bytes as Beam's TFRecord sink writes (tested
in tests/writing/test_write_processes.py), without its per-record layers.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms import gcs
from transforms.encoding.encoder import EncodeSettings, encode_example
from transforms.encoding.objects import OBJECTS_STAGE, ObjectError, PreparedObjects
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

    A local uncompressed shard sends about a megabyte of framed records (header, the Example's
    chunks, footer) to one `os.writev`, so the image bytes are copied once, by the kernel. Gzip
    and remote shards go through `gcs.create`, one write per framed record as the sink does.
    """

    def __init__(self, path: str, compression: str = "none"):
        self.path = path
        self._buffers: list[bytes] = []  # header, chunks and footer of the records not yet written
        self._pending = 0  # their bytes
        self._fd = -1
        self._file = None
        if compression == "none" and "://" not in path and hasattr(os, "writev"):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # not inherited
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
    """How every shard of a run is written (small and picklable: it goes to worker processes):
    into `<temp_dir>/<split>/`, 'none' or 'gzip', with `<shard>.idx` files if `write_index`
    (uncompressed only), images read by `reader` (transient errors retried by `retry`)."""

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
    """What writing one ShardTask (or part of one) gave: the temp shard (None if no image was
    written), the images that could not be read or decoded, and each written record's data
    bytes in order (for the index of joined parts)."""

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
    other exception is a bug and propagates. `pool` reads, checks and encodes the next images
    ahead (transforms/images/prefetch.py) or, with `reads_only`, only reads them (the rest
    holds the GIL). `on_written(nbytes)` is called after each written image. `hint_ahead` > 0
    opens that many local files ahead (OpenAhead; the default reader only). With `whole`
    False the task is one part of a shard: its index file is written by processes.join_parts.
    """
    settings, retry = job.settings, job.retry
    # Large files are checked from their first bytes before being read whole (images/limits.py).
    check = functools.partial(check_header, max_pixels=settings.max_pixels)
    reader = functools.partial(read_bytes, check=check) if job.reader is read_bytes else job.reader

    def read(record: ImageRecord) -> bytes:
        return read_with_retries(record.path, reader, retry)

    def read_path(path: str) -> bytes:  # a class map beside an image (records with objects)
        return read_with_retries(path, job.reader, retry)

    def load(record: ImageRecord, data: bytes | None = None) -> Encoded:
        data = read(record) if data is None else data
        return encode_example(record, data, class_index, settings, read_path)

    # Records are built from the task's columns as they are consumed (a part holds up to
    # processes.PART_RECORDS of them).
    records = task.iter_records()
    ahead = hint_ahead if pool is None and job.reader is read_bytes and not reads_only else 0
    opened = OpenAhead(task.batch.paths, ahead)

    def load_opened(i: int, record: ImageRecord) -> Encoded:
        fd = opened.take(i)
        if fd is None:
            return load(record)
        try:
            data = read_open(fd, check)
        except ReadError:
            raise
        except OSError:  # transient: read again from the path, with the usual retries
            data = read(record)
        return load(record, data)

    def load_read(record: ImageRecord, got: Callable[[], bytes]) -> Encoded:
        return load(record, got())

    if reads_only:  # `pool` reads ahead; this thread checks and encodes
        loaded = ((r, functools.partial(load_read, r, got)) for r, got in map_in_order(read, records, pool))
    elif ahead:
        loaded = ((r, functools.partial(load_opened, i, r)) for i, r in enumerate(records))
    else:
        loaded = map_in_order(load, records, pool)
    failures: list[Failure] = []
    sizes: list[int] = []
    formats: set[str] = set()
    per_class: collections.Counter = collections.Counter()
    objects: collections.Counter = collections.Counter()
    paused = PAUSE_ENV in os.environ  # the test hook (looked up once, not per image)
    with ShardFile(job.temp_path(task), job.compression) as shard, opened:
        for record, result in loaded:
            try:
                chunks, info, written_objects = result()
            except ImageError as e:
                failures.append(_failure(record, str(e), "decode"))
                continue
            except ObjectError as e:
                failures.append(_failure(record, str(e), OBJECTS_STAGE))
                continue
            except OSError as e:  # missing, unreadable, permission denied, transient I/O
                failures.append(_failure(record, f"unreadable: {e}", "read"))
                continue
            size = sum(map(len, chunks))
            shard.write_chunks(chunks, size)
            sizes.append(size)
            formats.add(info.format)  # as stored, after any conversion
            per_class[(record.split, record.class_key)] += 1
            if written_objects is not None:
                object_counts(objects, record.split, written_objects)
            if on_written is not None:
                on_written(size)
            if paused:
                pause_if_asked("write_shard")
    if not sizes:
        delete_paths([shard.path])
        return ShardOutcome(None, tuple(failures))
    if job.write_index and whole:
        write_index(shard.path, sizes)
    written = tuple(sorted(per_class.items()))
    result = ShardResult(
        task.split,
        task.index,
        shard.path,
        len(sizes),
        sum(sizes),
        tuple(sorted(formats)),
        written,
        tuple(sorted(objects.items())),
    )
    return ShardOutcome(result, tuple(failures), tuple(sizes))


# What one image's load gives: the Example's chunks, its image info, its objects as written (or None).
Encoded = tuple[list[bytes], ImageInfo, PreparedObjects | None]


def object_counts(counts: collections.Counter, split: str, objects: PreparedObjects) -> None:
    """Adds one written image's objects to `counts`, keyed (count, split, name): 'objects' per
    class name, 'images' (with objects) or 'background' (none), 'masks', 'class_maps', and
    'boxes' per kind of clip or drop (encoding/objects.py)."""
    for label in objects.labels:
        counts[("objects", split, label)] += 1
    counts[("images" if len(objects) else "background", split, "")] += 1
    if objects.masks:
        counts[("masks", split, "")] += len(objects.masks)
    if objects.class_map is not None:
        counts[("class_maps", split, "")] += 1
    for name, n in objects.counts:
        counts[("boxes", split, name)] += n


def open_hinted(path: str) -> int | None:
    """A local file opened after asking the kernel to read it into the page cache, or None.

    Opened non-blocking (a FIFO must not hang here); None for a remote path or when the file
    cannot be opened (the real read reports it). For an archive member only its bytes are
    hinted, and None is returned: the read opens the archive itself.
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
        else:
            os.posix_fadvise(fd, address.offset, address.size, os.POSIX_FADV_WILLNEED)
            os.close(fd)
            return None
    except OSError:
        pass
    return fd


class OpenAhead:
    """The files of a shard opened `ahead` images before they are read (`open_hinted`): the
    kernel reads them in while earlier images are written (a cold disk serves several reads at
    once), and the read uses the open descriptor. Leaving the context closes what was not read."""

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


def _failure(record: ImageRecord, reason: str, stage: str) -> Failure:
    return Failure(record.path, reason, stage, record.split, record.class_key)
